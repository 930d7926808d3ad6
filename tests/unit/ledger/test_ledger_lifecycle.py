"""The batch state machine beyond the happy path: waiting, failed attempts, cancellation, expiry, anomalies."""

import logging

import pytest

from contracts.api.batch import BatchUsage, InputTokensDetails
from contracts.events.batch import (
    AttemptFailed,
    BatchAssigned,
    BatchCancelled,
    BatchCancelRequested,
    BatchExpired,
    BatchFinalizing,
    BatchProgressed,
    BatchValidationFailed,
    BatchWaiting,
    LineRejected,
    ShardFinished,
    ValidationProgressed,
)
from services.ledger.application import Ledger, persistence_env
from services.ledger.projection import batch_record
from tests.unit.ledger.test_ledger_domain import BATCH, T0, Stream, at, completed, created, started, validated

USAGE = BatchUsage(input_tokens=50, input_tokens_details=InputTokensDetails(cached_tokens=8), output_tokens=10,
                   total_tokens=60)


def assigned(attempt: int) -> BatchAssigned:
    return BatchAssigned(aggregate_id=BATCH, executor_id=f"exec-{attempt}", attempt=attempt, lease_token="t",
                         occurred_at=at(3))


def progressed(attempt: int, chunk: int, done: int) -> BatchProgressed:
    return BatchProgressed(aggregate_id=BATCH, attempt=attempt, chunk=chunk, chunk_key=f"c{chunk}", completed=done,
                           failed=0, occurred_at=at(5))


def attempt_failed(attempt: int) -> AttemptFailed:
    return AttemptFailed(aggregate_id=BATCH, attempt=attempt, executor_id=f"exec-{attempt}", code="executor_lost",
                         reason="missed heartbeats", occurred_at=at(6))


def cancel_requested() -> BatchCancelRequested:
    return BatchCancelRequested(aggregate_id=BATCH, requested_by_key_id="key_a", occurred_at=at(7))


def cancelled() -> BatchCancelled:
    return BatchCancelled(aggregate_id=BATCH, output_file_id="file-out", error_file_id="file-err", completed=4,
                          failed=6, usage=USAGE, occurred_at=at(8))


def test_a_waiting_batch_says_why_until_it_starts(ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(created(), validated(), BatchWaiting(aggregate_id=BATCH, reason="no executor serves model m"))
    batch = stream.record().batch
    assert (batch.status, batch.status_reason) == ("validated", "no executor serves model m")
    stream.fold(assigned(1), started())
    assert (stream.record().batch.status, stream.record().batch.status_reason) == ("in_progress", None)


def waiting(reason: str) -> BatchWaiting:
    return BatchWaiting(aggregate_id=BATCH, reason=reason, occurred_at=at(5))


def test_a_running_batch_says_where_it_stands_and_stays_running(ledger: Ledger) -> None:
    stream = Stream(ledger)
    standing = "Running on 1 executor: 40 % done, under a minute left."
    stream.fold(created(), validated(), waiting("Queued: 1st for m, under a minute."), assigned(1), started(),
                progressed(1, 0, 4), waiting(standing))
    batch = stream.record().batch
    assert (batch.status, batch.status_reason) == ("in_progress", standing)
    assert batch.request_counts.completed == 4 and ledger.anomalies(BATCH) == []


def test_another_executor_starting_keeps_a_running_batchs_standing(ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(created(), validated(), assigned(1), started(1), waiting("Running on 1 executor: 10 % done."),
                assigned(2), started(2))
    assert stream.record().batch.status_reason == "Running on 1 executor: 10 % done."


def test_a_running_batchs_standing_ends_when_it_finalizes(ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(created(), validated(), assigned(1), started(), waiting("Running on 1 executor: 90 % done."),
                BatchFinalizing(aggregate_id=BATCH, attempt=1))
    assert (stream.record().batch.status, stream.record().batch.status_reason) == ("finalizing", None)
    stream.fold(completed())
    assert (stream.record().batch.status, stream.record().batch.status_reason) == ("completed", None)


def test_a_running_batchs_standing_ends_when_a_cancel_is_asked(ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(created(), validated(), assigned(1), started(), waiting("Running on 1 executor: 50 % done."),
                cancel_requested())
    assert (stream.record().batch.status, stream.record().batch.status_reason) == ("cancelling", None)


def test_a_standing_that_arrives_after_the_batch_moved_on_is_dropped_without_an_anomaly(ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(created(), validated(), assigned(1), started(), BatchFinalizing(aggregate_id=BATCH, attempt=1),
                waiting("Running on 1 executor: 99 % done."), completed(), waiting("Running on 1 executor: 99 % done."))
    assert (stream.record().batch.status, stream.record().batch.status_reason) == ("completed", None)
    assert ledger.anomalies(BATCH) == []


def test_a_standing_before_validation_ended_is_an_anomaly(ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(created(), waiting("Queued: 1st for m."))
    assert (stream.record().batch.status, stream.record().batch.status_reason) == ("validating", None)
    assert [a["fact"] for a in ledger.anomalies(BATCH)] == ["waiting"]


def test_a_failed_attempt_returns_the_batch_to_validated_and_a_later_attempt_resumes_it(ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(created(), validated(), assigned(1), started(1), progressed(1, 0, 3), attempt_failed(1))
    batch = stream.record().batch
    assert (batch.status, batch.status_reason, batch.request_counts.completed) == (
        "validated", "missed heartbeats", 3)
    stream.fold(progressed(1, 1, 5))  # a chunk of the lost attempt that was durable before it was lost
    stream.fold(assigned(2), started(2), progressed(2, 2, 4), BatchFinalizing(aggregate_id=BATCH, attempt=2),
                completed())
    assert stream.record().batch.status == "completed"
    assert [f["attempt"] for f in stream.batch().attempt_failures] == [1]
    assert ledger.anomalies(BATCH) == []


def test_a_start_of_a_failed_attempt_is_an_anomaly(ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(created(), validated(), assigned(1), started(1), attempt_failed(1), started(1))
    assert stream.record().batch.status == "validated"
    [anomaly] = ledger.anomalies(BATCH)
    assert anomaly["fact"] == "started" and anomaly["sequence"] == stream.seq


def test_a_cancelled_batch_keeps_what_was_done_and_its_usage(ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(created(), validated(), assigned(1), started(), cancel_requested())
    assert (stream.record().batch.status, stream.record().batch.cancelling_at) == ("cancelling", T0 + 7)
    stream.fold(progressed(1, 0, 4), cancelled())
    batch = stream.record().batch
    assert (batch.status, batch.cancelled_at) == ("cancelled", T0 + 8)
    assert batch.request_counts.model_dump() == {"total": 10, "completed": 4, "failed": 6}
    assert (batch.output_file_id, batch.error_file_id) == ("file-out", "file-err")
    assert batch.usage == USAGE and stream.batch().cancel_requested_by == "key_a"


def test_completed_after_cancelled_is_an_anomaly_and_the_batch_stays_cancelled(ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(created(), validated(), started(), cancel_requested(), cancelled())
    before = stream.record().batch
    stream.fold(completed())
    assert stream.record().batch == before
    [anomaly] = ledger.anomalies(BATCH)
    assert anomaly == {"sequence": stream.seq, "fact": "completed",
                       "reason": "completed is not allowed while cancelled"}


def test_a_cancel_requested_while_finalizing_is_an_anomaly(ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(created(), validated(), started(), BatchFinalizing(aggregate_id=BATCH, attempt=1),
                cancel_requested())
    assert stream.record().batch.status == "finalizing"
    assert [a["fact"] for a in ledger.anomalies(BATCH)] == ["cancel_requested"]


def test_a_finalizing_fact_after_an_accepted_cancel_changes_nothing_and_the_batch_ends_cancelled(
        ledger: Ledger) -> None:
    """The cancel came first in the log, so it decides: the finalizer ends the batch `cancelled` (a race the log
    settles, not an anomaly)."""
    stream = Stream(ledger)
    stream.fold(created(), validated(), assigned(1), started(), cancel_requested(),
                BatchFinalizing(aggregate_id=BATCH, attempt=1, occurred_at=at(8)))
    assert (stream.record().batch.status, stream.record().batch.finalizing_at) == ("cancelling", None)
    stream.fold(cancelled())
    assert stream.record().batch.status == "cancelled" and ledger.anomalies(BATCH) == []


def test_a_batch_cancelled_while_validating_counts_its_lines_when_the_verdict_comes_and_ends_cancelled(
        ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(created(), cancel_requested(), validated(total=10))
    assert (stream.record().batch.status, stream.record().batch.request_counts.total) == ("cancelling", 10)
    stream.fold(cancelled())
    batch = stream.record().batch
    assert batch.status == "cancelled" and batch.request_counts.model_dump() == {"total": 10, "completed": 4,
                                                                               "failed": 6}
    assert ledger.anomalies(BATCH) == []


def test_a_batch_cancelled_while_validating_a_file_that_fails_validation_ends_cancelled_with_its_error_file(
        ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(created(), cancel_requested(),
                BatchValidationFailed(aggregate_id=BATCH, total_lines=5, error_count=3, rejected_lines=2,
                                      counts_by_code={"invalid_json": 3}, error_file_id="file-err", occurred_at=at(9)))
    batch = stream.record().batch
    assert (batch.status, batch.cancelled_at, batch.failed_at, batch.error_file_id) == (
        "cancelled", T0 + 9, None, "file-err")
    assert batch.request_counts.model_dump() == {"total": 5, "completed": 0, "failed": 5}
    assert ledger.anomalies(BATCH) == []


def test_the_line_errors_of_a_batch_cancelled_while_validating_are_kept_with_its_verdict(ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(created(), cancel_requested(),
                LineRejected(aggregate_id=BATCH, line=2, code="invalid_json", message="not JSON", occurred_at=at(8)),
                BatchValidationFailed(aggregate_id=BATCH, total_lines=5, error_count=1, rejected_lines=1,
                                      counts_by_code={"invalid_json": 1}, error_file_id="file-err", occurred_at=at(9)))
    batch = stream.record().batch
    assert batch.status == "cancelled" and batch.errors is not None
    assert [(e.line, e.code) for e in batch.errors.data] == [(2, "invalid_json")]
    assert ledger.anomalies(BATCH) == []


def test_cancelled_without_a_request_is_an_anomaly(ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(created(), validated(), cancelled())
    assert stream.record().batch.status == "validated"
    assert [a["fact"] for a in ledger.anomalies(BATCH)] == ["cancelled"]


def test_an_expired_batch_records_when_and_what_was_done(ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(created(), validated(), started(), BatchExpired(
        aggregate_id=BATCH, output_file_id=None, error_file_id="file-err", completed=0, failed=10,
        usage=BatchUsage(), occurred_at=at(86_400)))
    batch = stream.record().batch
    assert (batch.status, batch.expired_at, batch.error_file_id) == ("expired", T0 + 86_400, "file-err")
    assert batch.request_counts.failed == 10


def test_usage_is_taken_once_from_the_end_and_a_refold_never_adds_it_again(ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(created(), validated(), started(), completed())
    usage = stream.record().batch.usage
    ledger.fold([(stream.seq, completed())])
    assert stream.record().batch.usage == usage
    assert usage is not None and usage.total_tokens == 120


def test_the_state_is_the_same_whatever_the_facts_grouping(ledger: Ledger) -> None:
    story = [created(), validated(), assigned(1), started(1), *(progressed(1, c, c + 1) for c in range(7)),
             attempt_failed(1), progressed(1, 7, 9), assigned(2), started(2),
             *(progressed(2, c, c + 1) for c in range(8, 12)), completed()]
    numbered = list(enumerate(story, start=1))
    ledger.fold(numbered)
    one_by_one = Ledger(persistence_env(None))
    try:
        for fact in numbered:
            one_by_one.fold([fact])
        again = one_by_one.batch(BATCH)
        assert again is not None
        assert batch_record(again) == batch_record(Stream(ledger).batch())
        assert again.attempt_failures == Stream(ledger).batch().attempt_failures
    finally:
        one_by_one.close()


def test_a_sharded_batch_counts_the_sum_of_its_shards_and_runs_while_any_shard_runs(ledger: Ledger) -> None:
    stream = Stream(ledger)

    def shard_assigned(attempt: int, shard: int) -> BatchAssigned:
        return BatchAssigned(aggregate_id=BATCH, executor_id=f"exec-{shard}", attempt=attempt, lease_token="t",
                             shard=shard, shards=2, shard_span=5, occurred_at=at(3))

    def shard_progressed(attempt: int, shard: int, done: int) -> BatchProgressed:
        return BatchProgressed(aggregate_id=BATCH, attempt=attempt, chunk=0, chunk_key=f"a{attempt}", shard=shard,
                               completed=done, failed=0, occurred_at=at(5))

    stream.fold(created(), validated(), shard_assigned(1, 0), shard_assigned(2, 1), started(1), started(2),
                shard_progressed(1, 0, 3), shard_progressed(2, 1, 4))
    batch = stream.record().batch
    assert (batch.status, batch.request_counts.completed) == ("in_progress", 7)
    stream.fold(attempt_failed(2))  # shard 1 lost; shard 0 still runs
    assert (stream.record().batch.status, stream.record().batch.request_counts.completed) == ("in_progress", 7)
    stream.fold(shard_assigned(3, 1), started(3), shard_progressed(3, 1, 5), shard_progressed(1, 0, 5),
                ShardFinished(aggregate_id=BATCH, attempt=1, shard=0, executor_id="exec-0", occurred_at=at(6)),
                ShardFinished(aggregate_id=BATCH, attempt=3, shard=1, executor_id="exec-1", occurred_at=at(6)),
                BatchFinalizing(aggregate_id=BATCH, attempt=0), completed())
    assert stream.record().batch.status == "completed"
    assert ledger.anomalies(BATCH) == []


def test_validation_progress_leaves_the_batch_as_it_is_without_a_warning(
        ledger: Ledger, caplog: pytest.LogCaptureFixture) -> None:
    stream = Stream(ledger)
    stream.fold(created())
    before = stream.record().batch
    with caplog.at_level(logging.INFO, logger="services.ledger"):
        stream.fold(ValidationProgressed(aggregate_id=BATCH, lines_read=1000, errors_found=2, occurred_at=at(1)))
    assert stream.record().batch == before
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING] == []
