"""The batch census counts each batch once, under its latest status, whatever order and how often its records come."""

from contracts.api.batch import Batch
from contracts.api.batch import BatchStatus as Status
from contracts.readmodel import BatchRecord
from services.gateway.batch_census import BatchCensus


def record(batch_id: str, status: Status) -> BatchRecord:
    batch = Batch(id=batch_id, endpoint="/v1/chat/completions", input_file_id="file-1", completion_window="24h",
                  status=status, created_at=1_700_000_000, model="m")
    return BatchRecord(owner_key_id="key_1", batch=batch, last_sequence=1)


def test_a_batch_moves_from_status_to_status_and_is_counted_once() -> None:
    census = BatchCensus()
    for status in ("validating", "validated", "in_progress", "finalizing", "completed"):
        census.record("batch_a", record("batch_a", status))
    census.record("batch_b", record("batch_b", "in_progress"))

    assert census.by_status() == {"completed": 1, "in_progress": 1}
    assert set(census.open) == {"batch_b"}


def test_an_ended_batch_whose_record_is_written_again_is_not_counted_twice() -> None:
    census = BatchCensus()
    census.record("batch_a", record("batch_a", "cancelled"))
    census.record("batch_a", record("batch_a", "cancelled"))

    assert census.by_status() == {"cancelled": 1}


def test_a_deleted_record_is_no_longer_counted_and_a_reset_forgets_everything() -> None:
    census = BatchCensus()
    census.record("batch_a", record("batch_a", "failed"))
    census.record("batch_b", record("batch_b", "validated"))
    census.record("batch_a", None)

    assert census.by_status() == {"validated": 1}
    census.reset()
    assert census.by_status() == {} and census.open == {}
