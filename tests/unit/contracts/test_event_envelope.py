"""The envelope's defaults: a fact belongs to its batch without anyone writing so."""

import pytest
from pydantic import ValidationError

from contracts.events.batch import BatchReleased
from contracts.events.file import FileStored, FileUsed
from contracts.events.key import KeyRevoked
from contracts.events.registry import decode_event


def _stored(batch_id: str | None) -> FileStored:
    return FileStored(aggregate_id="file_1", owner_key_id="key_1", filename="f.jsonl", purpose="batch_output",
                      bytes=1, sha256="0" * 64, object_key="k", created_at=1, batch_id=batch_id)


def test_a_batch_fact_belongs_to_its_batch_unless_told_otherwise() -> None:
    assert BatchReleased(aggregate_id="batch_1", released_by_key_id="k").correlation_id == "batch_1"
    assert BatchReleased(aggregate_id="batch_1", released_by_key_id="k", correlation_id="req_9").correlation_id \
        == "req_9"


def test_a_file_fact_belongs_to_the_batch_it_names_and_an_upload_to_none() -> None:
    assert FileUsed(aggregate_id="file_1", batch_id="batch_2").correlation_id == "batch_2"
    assert _stored("batch_3").correlation_id == "batch_3"
    assert _stored(None).correlation_id is None


def test_facts_of_no_batch_have_no_correlation() -> None:
    assert KeyRevoked(aggregate_id="k" * 32, key_sha256="0" * 64, revoked_by_key_id=None).correlation_id is None


def test_a_stored_fact_decodes_with_the_correlation_it_was_stored_with() -> None:
    stored = BatchReleased(aggregate_id="batch_1", released_by_key_id="k", correlation_id=None).model_dump_json()
    assert BatchReleased.model_validate_json(stored).correlation_id is None


@pytest.mark.parametrize("payload", [b'{"type": "batch.created"}', b'{"type": "batch.created", "aggregate_id": 7}'])
def test_a_fact_without_an_aggregate_id_is_invalid_not_an_error_that_wedges_its_reader(payload: bytes) -> None:
    with pytest.raises(ValidationError):
        decode_event(payload)
