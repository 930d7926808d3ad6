"""What a batch's log says about one unit (one shard of a fine layout, one attempt) among many: which announced
chunks can hold its lines, and that its fence is its own."""

from contracts.events.batch import AttemptFailed, BatchAssigned, BatchProgressed, BatchStarted, ShardLayout
from contracts.subjects import result_chunk_key
from services.executor.attempts import BatchLog

BATCH = "batch_units"
UNITS = ShardLayout.split(2000, 32)


def assigned(attempt: int, shard: int, layout: ShardLayout = UNITS) -> BatchAssigned:
    return BatchAssigned(aggregate_id=BATCH, executor_id="exec", attempt=attempt, lease_token=f"lease-{attempt}",
                         shard=shard, shards=layout.shards, shard_span=layout.span)


def progressed(attempt: int, shard: int, chunk: int) -> BatchProgressed:
    return BatchProgressed(aggregate_id=BATCH, attempt=attempt, chunk=chunk,
                           chunk_key=result_chunk_key(BATCH, attempt, chunk), completed=chunk + 1, failed=0,
                           shard=shard)


def folded(*events: object) -> BatchLog:
    log = BatchLog()
    for sequence, event in enumerate(events, 1):
        log.fold(event, sequence)  # type: ignore[arg-type]
    return log


def test_a_unit_resumes_from_the_chunks_of_its_own_shard_only_whichever_attempt_announced_them() -> None:
    log = folded(assigned(1, 0), assigned(2, 1), progressed(1, 0, 0), progressed(2, 1, 0), progressed(2, 1, 1),
                 AttemptFailed(aggregate_id=BATCH, attempt=2, executor_id="exec", code="executor_lost", reason="x"),
                 assigned(3, 1), progressed(3, 1, 0))
    assert log.unit_chunks(1, UNITS) == {result_chunk_key(BATCH, 2, 0), result_chunk_key(BATCH, 2, 1),
                                         result_chunk_key(BATCH, 3, 0)}
    assert log.unit_chunks(0, UNITS) == {result_chunk_key(BATCH, 1, 0)}
    assert log.unit_chunks(5, UNITS) == set()


def test_chunks_of_an_attempt_of_another_layout_or_of_none_known_may_hold_any_unit_s_lines() -> None:
    whole = ShardLayout()
    log = folded(assigned(1, 0, whole), progressed(1, 0, 0), BatchStarted(
        aggregate_id=BATCH, executor_id="exec", attempt=7, engine="llamacpp", engine_version="t"),
        progressed(7, 0, 0), assigned(8, 4), progressed(8, 4, 0))
    # Attempt 1 ran the whole file, attempt 7 was never assigned in the log: their lines are told apart when read.
    assert log.unit_chunks(3, UNITS) == {result_chunk_key(BATCH, 1, 0), result_chunk_key(BATCH, 7, 0)}


def test_one_unit_s_failed_attempt_fences_it_alone_and_a_retry_fences_only_its_own_shard_s_earlier_attempt() -> None:
    log = folded(*(assigned(attempt, attempt - 1) for attempt in range(1, 9)))
    assert all(log.is_current(attempt) for attempt in range(1, 9))
    log.fold(AttemptFailed(aggregate_id=BATCH, attempt=3, executor_id="exec", code="executor_lost", reason="x"), 9)
    assert not log.is_current(3) and all(log.is_current(attempt) for attempt in (1, 2, 4, 5, 6, 7, 8))
    log.fold(assigned(9, 4), 10)  # unit 4 leased again: its attempt 5 is superseded, nobody else's
    assert not log.is_current(5) and log.is_current(9) and all(log.is_current(a) for a in (1, 2, 4, 6, 7, 8))
    assert log.fence_sequence == 9


def test_an_attempt_started_before_its_assignment_was_read_is_judged_by_its_shard_once_it_is() -> None:
    log = folded(assigned(1, 0), BatchStarted(aggregate_id=BATCH, executor_id="exec", attempt=2, engine="llamacpp",
                                              engine_version="t"))
    assert not log.is_current(1), "an unassigned attempt counts as the first shard's"
    log.fold(assigned(2, 1), 3)
    assert log.is_current(1) and log.is_current(2)
