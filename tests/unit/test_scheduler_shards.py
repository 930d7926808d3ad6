"""Large batches run as shards on several executors; the queued-lines limit; the shard layout itself."""

from collections.abc import Sequence

from contracts.events.batch import (
    AttemptFailed,
    BatchAssigned,
    BatchCancelRequested,
    BatchCreated,
    BatchValidated,
    ShardFinished,
    ShardLayout,
)
from services.scheduler.book import Book
from services.scheduler.decisions import (
    Assign,
    DeclareLost,
    FailBatch,
    FenceAttempt,
    Finalize,
    Policy,
    decide,
)
from services.scheduler.domain import HEARTBEAT_FRESH_MS
from tests.unit.test_scheduler_decisions import CATALOGUE, NOW, advert

POLICY = Policy(shard_min_lines=100, max_queued_lines=10_000)


def book_with(batch: str, lines: int, owner: str = "k", book: Book | None = None) -> Book:
    book = book or Book(admitted={"e1", "e2", "e3", "e4"},
                        known_executors=dict.fromkeys(("e1", "e2", "e3", "e4"), NOW))
    book.apply(BatchCreated(aggregate_id=batch, owner_key_id=owner, input_file_id="f", input_object_key="files/f",
                            endpoint="/v1/chat/completions", completion_window="24h", created_at=0,
                            expires_at=NOW // 1000 + 3600))
    book.apply(BatchValidated(aggregate_id=batch, total_lines=lines, model="m", owner_key_id=owner,
                              endpoint="/v1/chat/completions", input_object_key="files/f"))
    return book


def apply_assignments(book: Book, actions: Sequence[object]) -> list[Assign]:
    assigns = [action for action in actions if isinstance(action, Assign)]
    for action in assigns:
        book.apply(BatchAssigned(aggregate_id=action.plan.batch_id, executor_id=action.executor_id,
                                 attempt=action.attempt, lease_token="t", shard=action.shard,
                                 shards=action.layout.shards, shard_span=action.layout.span, occurred_at=NOW))
    return assigns


def test_a_large_batch_is_split_into_one_shard_per_able_executor_each_on_its_own_executor() -> None:
    book = book_with("b1", 1000)
    assigns = apply_assignments(book, decide(book, [advert("e1"), advert("e2"), advert("e3")], CATALOGUE, NOW,
                                             POLICY))
    assert [(a.shard, a.attempt) for a in assigns] == [(0, 1), (1, 2), (2, 3)]
    assert len({a.executor_id for a in assigns}) == 3
    layout = assigns[0].layout
    assert (layout.shards, layout.span) == (3, 334)
    assert decide(book, [advert("e1"), advert("e2"), advert("e3")], CATALOGUE, NOW, POLICY) == []


def test_a_batch_below_two_shards_worth_of_lines_runs_whole_on_one_executor() -> None:
    book = book_with("b1", 150)
    [assign] = apply_assignments(book, decide(book, [advert("e1"), advert("e2")], CATALOGUE, NOW, POLICY))
    assert (assign.shard, assign.layout) == (0, ShardLayout())


def test_once_every_shard_finished_the_batch_is_finalized_once() -> None:
    book = book_with("b1", 1000)
    fleet = [advert("e1"), advert("e2")]
    assigns = apply_assignments(book, decide(book, fleet, CATALOGUE, NOW, POLICY))
    book.apply(ShardFinished(aggregate_id="b1", attempt=assigns[0].attempt, shard=0, executor_id="e1"))
    assert decide(book, fleet, CATALOGUE, NOW, POLICY) == []
    book.apply(ShardFinished(aggregate_id="b1", attempt=assigns[1].attempt, shard=1, executor_id="e2"))
    [finalize] = decide(book, fleet, CATALOGUE, NOW, POLICY)
    assert isinstance(finalize, Finalize) and finalize.reason == "completed"
    book.plans["b1"].finalizer = finalize.executor_id
    assert decide(book, fleet, CATALOGUE, NOW, POLICY) == []


def test_a_lost_executors_shard_is_fenced_and_rerun_elsewhere_while_the_other_shard_keeps_running() -> None:
    book = book_with("b1", 1000)
    assigns = apply_assignments(book, decide(book, [advert("e1"), advert("e2")], CATALOGUE, NOW, POLICY))
    lost = next(a for a in assigns if a.executor_id == "e2")
    now = NOW + HEARTBEAT_FRESH_MS + 1
    fleet = [advert("e1", heartbeat_at=now), advert("e3", heartbeat_at=now)]
    book.note_heartbeats(fleet)
    [fence] = [a for a in decide(book, fleet, CATALOGUE, now, POLICY) if not isinstance(a, DeclareLost)]
    assert isinstance(fence, FenceAttempt) and (fence.attempt, fence.executor_id) == (lost.attempt, "e2")
    book.apply(AttemptFailed(aggregate_id="b1", attempt=lost.attempt, executor_id="e2", code="executor_lost",
                             reason="x"))
    [retry] = apply_assignments(book, decide(book, fleet, CATALOGUE, now, POLICY))
    assert (retry.executor_id, retry.shard, retry.attempt, retry.layout) == ("e3", lost.shard, 3, lost.layout)


def test_a_shard_that_fails_three_times_stops_the_others_and_finalizes_the_batch_as_failed() -> None:
    book = book_with("b1", 1000)
    fleet = [advert("e1"), advert("e2")]
    apply_assignments(book, decide(book, fleet, CATALOGUE, NOW, POLICY))
    for _ in range(3):
        run = book.plans["b1"].shard(1)
        book.apply(AttemptFailed(aggregate_id="b1", attempt=run.attempt, executor_id=run.executor_id or "",
                                 code="engine_crashed", reason="x"))
        apply_assignments(book, decide(book, fleet, CATALOGUE, NOW, POLICY))
    actions = decide(book, fleet, CATALOGUE, NOW, POLICY)
    assert [(type(a), getattr(a, "code", None) or getattr(a, "failure_code", None)) for a in actions] == [
        (FenceAttempt, "attempts_exhausted"), (Finalize, "attempts_exhausted")]
    assert isinstance(actions[0], FenceAttempt) and book.plans["b1"].attempt_shard[actions[0].attempt] == 0


def test_a_cancelled_sharded_batch_waits_for_its_shards_to_stop_then_is_finalized() -> None:
    book = book_with("b1", 1000)
    fleet = [advert("e1"), advert("e2")]
    assigns = apply_assignments(book, decide(book, fleet, CATALOGUE, NOW, POLICY))
    book.apply(BatchCancelRequested(aggregate_id="b1", requested_by_key_id="k", occurred_at=NOW))
    assert decide(book, fleet, CATALOGUE, NOW + 1000, POLICY) == []
    for assign in assigns:
        book.apply(ShardFinished(aggregate_id="b1", attempt=assign.attempt, shard=assign.shard,
                                 executor_id=assign.executor_id, stopped=True))
    [finalize] = decide(book, fleet, CATALOGUE, NOW + 2000, POLICY)
    assert isinstance(finalize, Finalize) and finalize.reason == "cancelled"


def test_a_batch_past_its_owners_queued_lines_limit_fails_and_other_owners_are_not_affected() -> None:
    book = book_with("first", 6000)
    book = book_with("second", 6000, book=book)
    book = book_with("other", 6000, owner="someone-else", book=book)
    actions = decide(book, [], CATALOGUE, NOW, POLICY)
    failed = [(a.plan.batch_id, a.code) for a in actions if isinstance(a, FailBatch)]
    assert failed == [("second", "enqueued_request_limit_exceeded")]


def test_shards_cover_every_line_exactly_once() -> None:
    for total, shards in ((1000, 3), (10, 4), (7, 7), (5, 1), (1, 3)):
        layout = ShardLayout.split(total, shards)
        owners = [layout.shard_of(line) for line in range(1, total + 1)]
        for line, shard in zip(range(1, total + 1), owners, strict=True):
            last = layout.last_line(shard)
            assert layout.first_line(shard) <= line and (last is None or line <= last)
        assert sorted(set(owners)) == list(range(layout.shards))


def test_attempts_that_committed_lines_before_dying_do_not_count_against_the_attempt_limit() -> None:
    from contracts.events.batch import BatchProgressed

    book = book_with("b1", 150)
    fleet = [advert("e1"), advert("e2")]
    for _ in range(4):
        [assign] = apply_assignments(book, decide(book, fleet, CATALOGUE, NOW, POLICY))
        book.apply(BatchProgressed(aggregate_id="b1", attempt=assign.attempt, chunk=0, chunk_key="k", completed=1,
                                   failed=0))
        book.apply(AttemptFailed(aggregate_id="b1", attempt=assign.attempt, executor_id=assign.executor_id,
                                 code="executor_lost", reason="x"))
    assert [type(a) for a in decide(book, fleet, CATALOGUE, NOW, POLICY)] == [Assign]
