"""The ledger's folding rules, in memory (POPO): statuses, error caps, idempotence, anomalies."""


import pytest
from eventsourcing.application import project_aggregate

from contracts.api.batch import BatchUsage
from contracts.events.batch import (
    AttemptFailed,
    BatchAssigned,
    BatchCancelRequested,
    BatchCompleted,
    BatchCreated,
    BatchFailed,
    BatchFinalizing,
    BatchProgressed,
    BatchStarted,
    BatchValidated,
    BatchValidationFailed,
    LineRejected,
)
from contracts.events.envelope import Event
from contracts.events.executor import ExecutorAdvert, ExecutorLost, ExecutorRegistered
from contracts.events.file import FileDeleted, FileStored
from contracts.events.key import KeyCreated
from contracts.readmodel import BatchRecord
from services.ledger.application import Ledger
from services.ledger.domainmodel import Batch
from services.ledger.folded import TOPIC_MODULE
from services.ledger.projection import api_key_record, batch_record, file_record
from tests.factories import batch_created

BATCH = "batch_unit1"
T0 = 1_700_000_000


class Stream:
    """Numbers facts the way the EVENTS stream would."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.seq = 0

    def fold(self, *facts: Event) -> None:
        numbered = []
        for fact in facts:
            self.seq += 1
            numbered.append((self.seq, fact))
        self.ledger.fold(numbered)

    def batch(self) -> Batch:
        batch = self.ledger.batch(BATCH)
        assert batch is not None
        return batch

    def record(self) -> BatchRecord:
        return batch_record(self.batch())


def at(seconds: int) -> int:
    return (T0 + seconds) * 1000


def created(batch_id: str = BATCH) -> BatchCreated:
    return batch_created(batch_id, "key_a", "files/file-in", created_at=T0, expires_at=T0 + 86400,
                         metadata={"team": "nlp"}, occurred_at=at(0))


def rejected(line: int, code: str = "invalid_json") -> LineRejected:
    return LineRejected(aggregate_id=BATCH, line=line, code=code, message="bad", occurred_at=at(1))


def validated(total: int = 10) -> BatchValidated:
    return BatchValidated(aggregate_id=BATCH, total_lines=total, model="smollm2-135m-instruct-q4_1", occurred_at=at(2))


def started(attempt: int = 1) -> BatchStarted:
    return BatchStarted(aggregate_id=BATCH, executor_id="exec-1", attempt=attempt, engine="llamacpp",
                        engine_version="1", occurred_at=at(4))


def completed() -> BatchCompleted:
    return BatchCompleted(aggregate_id=BATCH, output_file_id="file-out", error_file_id="file-err",
                          completed=9, failed=1, usage=BatchUsage(input_tokens=90, output_tokens=30,
                                                                  total_tokens=120), occurred_at=at(9))


def test_a_batch_runs_from_validating_to_completed_with_its_times_and_counts(ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(created())
    assert stream.record().batch.status == "validating"
    stream.fold(validated())
    assert stream.record().batch.status == "validated"
    stream.fold(BatchAssigned(aggregate_id=BATCH, executor_id="exec-1", attempt=1, lease_token="t",
                              occurred_at=at(3)))
    assert stream.record().batch.status == "validated"
    stream.fold(started(), BatchProgressed(aggregate_id=BATCH, attempt=1, chunk=0, chunk_key="k",
                                           completed=4, failed=1, occurred_at=at(5)))
    progressing = stream.record().batch
    assert progressing.status == "in_progress" and progressing.in_progress_at == T0 + 4
    assert (progressing.request_counts.completed, progressing.request_counts.failed) == (4, 1)
    stream.fold(BatchFinalizing(aggregate_id=BATCH, attempt=1, occurred_at=at(8)), completed())

    record = stream.record()
    batch = record.batch
    assert record.last_sequence == stream.seq and record.owner_key_id == "key_a"
    assert batch.status == "completed" and batch.model == "smollm2-135m-instruct-q4_1"
    assert (batch.created_at, batch.expires_at, batch.finalizing_at, batch.completed_at) == (
        T0, T0 + 86400, T0 + 8, T0 + 9)
    assert batch.request_counts.model_dump() == {"total": 10, "completed": 9, "failed": 1}
    assert (batch.output_file_id, batch.error_file_id) == ("file-out", "file-err")
    assert batch.usage is not None and batch.usage.total_tokens == 120
    assert batch.metadata == {"team": "nlp"} and batch.errors is None


def test_a_batch_with_bad_lines_keeps_the_first_100_errors_and_counts_all(ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(created(), *(rejected(n, "invalid_json" if n % 3 else "missing_custom_id")
                             for n in range(1, 251)))
    errors = stream.record().batch.errors
    assert errors is not None
    assert len(errors.data) == 100 and [e.line for e in errors.data] == list(range(1, 101))
    assert errors.total == 250
    assert errors.counts_by_code == {"invalid_json": 167, "missing_custom_id": 83}


def test_a_failed_validation_takes_the_validators_totals_as_authoritative(ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(created(), rejected(1), rejected(2))
    stream.fold(BatchValidationFailed(aggregate_id=BATCH, total_lines=1000, error_count=700,
                                      counts_by_code={"invalid_json": 700}, occurred_at=at(3)))
    batch = stream.record().batch
    assert batch.status == "failed" and batch.failed_at == T0 + 3
    assert batch.errors is not None and batch.errors.total == 700 and len(batch.errors.data) == 2
    assert batch.errors.counts_by_code == {"invalid_json": 700}
    assert batch.request_counts.total == 1000


def test_a_fact_folded_a_second_time_changes_nothing(ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(created(), rejected(1), validated())
    before = stream.record().model_dump()
    version = stream.batch().version

    touched = ledger.fold([(2, rejected(1)), (3, validated())])

    assert [aggregate.id for aggregate in touched] == [stream.batch().id]
    assert stream.record().model_dump() == before
    assert stream.batch().version == version


def test_started_after_completed_is_an_anomaly_and_the_batch_stays_completed(ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(created(), validated(), started(), completed())
    stream.fold(started(attempt=2))

    assert stream.record().batch.status == "completed"
    assert stream.record().last_sequence == stream.seq
    [anomaly] = ledger.anomalies(BATCH)
    assert anomaly["sequence"] == stream.seq and "started" in anomaly["reason"]


def test_an_attempt_started_before_its_executor_read_the_cancel_is_no_anomaly(ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(created(), validated(), BatchAssigned(aggregate_id=BATCH, executor_id="exec-1", attempt=1,
                                                      lease_token="t", occurred_at=at(3)),
                BatchCancelRequested(aggregate_id=BATCH, requested_by_key_id="key_a", occurred_at=at(4)),
                started())
    assert stream.record().batch.status == "cancelling"
    assert ledger.anomalies(BATCH) == []


def test_a_batch_fails_with_its_reason_from_any_unfinished_status(ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(created(), validated(), started())
    stream.fold(BatchFailed(aggregate_id=BATCH, code="attempts_exhausted", reason="3 attempts failed",
                            occurred_at=at(7)))
    batch = stream.record().batch
    assert (batch.status, batch.failed_at, batch.status_reason) == ("failed", T0 + 7, "3 attempts failed")
    assert batch.errors is not None and [(e.code, e.message) for e in batch.errors.data] == [
        ("attempts_exhausted", "3 attempts failed")], "the cause is in errors.data, never errors: null"
    assert batch.output_file_id is None and batch.request_counts.completed == 0


def test_a_batch_failed_at_run_time_keeps_the_files_of_what_it_committed(ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(created(), validated(), started())
    stream.fold(BatchFailed(aggregate_id=BATCH, code="attempts_exhausted", reason="3 attempts failed",
                            output_file_id="file-out", error_file_id="file-err", completed=2, failed=3,
                            usage=BatchUsage(input_tokens=5, output_tokens=7, total_tokens=12)))
    batch = stream.record().batch
    assert (batch.status, batch.output_file_id, batch.error_file_id) == ("failed", "file-out", "file-err")
    assert (batch.request_counts.completed, batch.request_counts.failed) == (2, 3)
    assert batch.usage is not None and batch.usage.output_tokens == 7
    assert batch.errors is not None
    assert [(e.code, e.message, e.line) for e in batch.errors.data] == [("attempts_exhausted", "3 attempts failed",
                                                                           None)]


def test_facts_about_unknown_batches_are_skipped(ledger: Ledger) -> None:
    assert ledger.fold([(1, validated())]) == [] and ledger.batch(BATCH) is None


def test_an_executor_is_registered_again_after_a_restart_and_can_be_lost(ledger: Ledger) -> None:
    advert = ExecutorAdvert(executor_id="exec-1", engine="llamacpp", engine_version="1", models=["m"],
                            loaded_models=[], devices=[], slots=4, heartbeat_at=T0)
    ledger.fold([(1, ExecutorRegistered(aggregate_id="exec-1", advert=advert, started_at=T0)),
                 (2, ExecutorLost(aggregate_id="exec-1", last_heartbeat_at=at(5))),
                 (3, ExecutorRegistered(aggregate_id="exec-1", started_at=T0 + 60,
                                        advert=advert.model_copy(update={"engine_version": "2"})))])
    executor = ledger.executor("exec-1")
    assert executor is not None
    assert (executor.status, executor.registrations, executor.engine_version) == ("online", 2, "2")
    assert executor.anomalies == []


def test_files_and_keys_become_their_records(ledger: Ledger) -> None:
    ledger.fold([
        (1, FileStored(aggregate_id="file-in", owner_key_id="key_a", filename="in.jsonl", purpose="batch",
                       bytes=512, sha256="ab" * 32, object_key="files/file-in", created_at=T0)),
        (2, KeyCreated(aggregate_id="key_cd", key_sha256="cd" * 32, role="user", label="alice",
                       occurred_at=T0 * 1000)),
        (3, FileDeleted(aggregate_id="file-in", owner_key_id="key_a")),
    ])
    file, key = ledger.file("file-in"), ledger.api_key("cd" * 32)
    assert file is not None and key is not None
    record = file_record(file)
    assert record.deleted and record.file.model_dump() == {
        "id": "file-in", "object": "file", "bytes": 512, "created_at": T0, "filename": "in.jsonl",
        "purpose": "batch", "status": "processed", "expires_at": None}
    assert api_key_record(key).model_dump() == {"key_id": "key_" + "cd" * 8, "role": "user", "label": "alice",
                                                "user_id": None, "provider_id": None, "revoked": False,
                                                "created_at": T0}


def test_a_long_batch_reloads_from_the_store_as_it_was_folded(ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(created())
    for first in range(1, 301, 50):
        stream.fold(*(rejected(n) for n in range(first, first + 50)))
    stream.fold(validated(total=300))
    assert ledger.snapshots is not None
    # Snapshotted in the group where each hundredth version falls, so at most ~100 events are ever refolded.
    assert [s.originator_version for s in ledger.snapshots.get(stream.batch().id)] == [101, 201, 301]
    from_every_event = project_aggregate(None, ledger.events.get(stream.batch().id))
    assert isinstance(from_every_event, Batch)
    assert batch_record(from_every_event).model_dump() == stream.record().model_dump()
    from_snapshot = ledger.repository.get(stream.batch().id)
    assert batch_record(from_snapshot).model_dump() == stream.record().model_dump()


def test_stored_batch_topics_name_the_domainmodel_module(ledger: Ledger) -> None:
    Stream(ledger).fold(created())
    topics = {n.topic for n in ledger.recorder.select_notifications(start=1, limit=10)}
    assert {topic for topic in topics if ":Batch." in topic} == {f"{TOPIC_MODULE}:Batch.Created"}


def test_the_read_model_checkpoint_is_the_last_sequence_recorded(ledger: Ledger) -> None:
    assert ledger.checkpoint() == 0
    ledger.record_checkpoint(41)
    ledger.record_checkpoint(42)
    assert ledger.checkpoint() == 42


def test_the_folded_checkpoint_is_saved_with_the_state_and_a_refold_leaves_it(ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(created(), rejected(1), validated())
    assert ledger.folded_checkpoint() == 3
    ledger.fold([(2, rejected(1)), (3, validated())])
    assert ledger.folded_checkpoint() == 3 and ledger.checkpoint() == 0


def test_an_allow_partial_batch_shows_the_validators_true_error_totals(ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(created(), *(rejected(n) for n in range(1, 101)), *(rejected(n, "unsupported_model")
                                                                      for n in range(101, 201)))
    stream.fold(BatchValidated(aggregate_id=BATCH, total_lines=6000, model="smollm2-135m-instruct-q4_1",
                               rejected_lines=5200, error_count=5200,
                               counts_by_code={"invalid_json": 5000, "unsupported_model": 200}, occurred_at=at(2)))
    errors = stream.record().batch.errors
    assert errors is not None and (errors.total, len(errors.data)) == (5200, 100)
    assert errors.counts_by_code == {"invalid_json": 5000, "unsupported_model": 200}


def test_a_validated_fact_without_totals_keeps_the_counts_of_the_published_errors(ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(created(), rejected(1), rejected(2), validated())
    errors = stream.record().batch.errors
    assert errors is not None and (errors.total, errors.counts_by_code) == (2, {"invalid_json": 2})


def test_a_failed_validation_counts_lines_apart_from_errors_and_accounts_every_line_in_its_error_file(
        ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(created(), rejected(1), rejected(1, "unknown_fields"), rejected(2))
    stream.fold(BatchValidationFailed(aggregate_id=BATCH, total_lines=5, error_count=3, rejected_lines=2,
                                      counts_by_code={"invalid_json": 2, "unknown_fields": 1},
                                      error_file_id="file-err", occurred_at=at(3)))
    batch = stream.record().batch
    assert batch.status_reason == "2 of 5 input lines failed validation (3 errors)"
    assert batch.error_file_id == "file-err" and batch.output_file_id is None
    assert batch.request_counts.model_dump() == {"total": 5, "completed": 0, "failed": 5}


def test_a_failed_validation_shows_the_validators_reason_and_older_verdicts_claim_no_line_count(
        ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(created(), BatchValidationFailed(aggregate_id=BATCH, total_lines=9, error_count=1, rejected_lines=1,
                                                 counts_by_code={"too_many_tasks": 1}, reason="Too many requests."))
    assert stream.record().batch.status_reason == "Too many requests."
    stream.fold(created("batch_unit2"), BatchValidationFailed(aggregate_id="batch_unit2", total_lines=2,
                                                              error_count=3, counts_by_code={"invalid_json": 3}))
    old = ledger.batch("batch_unit2")
    assert old is not None and batch_record(old).batch.status_reason == "validation found 3 errors in 2 input lines"
    assert batch_record(old).batch.request_counts.failed == 0, "no error file accounts for its lines"


def test_a_run_time_failure_shows_in_the_batchs_errors_but_its_own_cancel_does_not(ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(created(), validated(), BatchAssigned(aggregate_id=BATCH, executor_id="exec-1", attempt=1,
                                                      lease_token="t", occurred_at=at(3)), started())
    stream.fold(AttemptFailed(aggregate_id=BATCH, attempt=1, executor_id="exec-1", code="executor_lost",
                              reason="no heartbeat for 30 s", occurred_at=at(5)))
    errors = stream.record().batch.errors
    assert errors is not None and errors.counts_by_code == {"executor_lost": 1}
    assert errors.data[0].line is None and "exec-1" in errors.data[0].message and "30 s" in errors.data[0].message
    stream.fold(BatchCancelRequested(aggregate_id=BATCH, requested_by_key_id="key_a", occurred_at=at(6)),
                AttemptFailed(aggregate_id=BATCH, attempt=2, executor_id="exec-2", code="batch_cancelled",
                              reason="cancelled", occurred_at=at(7)))
    assert stream.record().batch.errors == errors  # the owner's cancel, and the attempt it ended, add nothing


@pytest.mark.parametrize(("by_admin", "message"), [
    ("cancelled_by_org_admin", "Cancelled by Carla, an administrator of organization acme."),
    ("cancelled_by_platform_admin", "Cancelled by an administrator of the platform.")])
def test_a_cancel_by_an_administrator_names_them_in_the_batchs_errors(ledger: Ledger, by_admin: str,
                                                                       message: str) -> None:
    stream = Stream(ledger)
    stream.fold(created(), validated())
    cancel = BatchCancelRequested(aggregate_id=BATCH, requested_by_key_id="key_admin", by_admin=by_admin,
                                  by_admin_message=message, occurred_at=at(3))
    stream.fold(cancel, cancel)  # delivered twice: one entry
    batch = stream.record().batch
    assert batch.status == "cancelling" and batch.errors is not None
    assert [(e.code, e.message, e.line) for e in batch.errors.data] == [(by_admin, message, None)]
