"""The fold's decoding: a progress fact read straight from its JSON is exactly what its contract would make of it,
and every payload the shortcut does not take is judged by the contract as before."""

import json

import orjson
import pytest
from pydantic import ValidationError

from contracts.api.batch import BatchUsage, InputTokensDetails
from contracts.events.batch import BatchProgressed
from contracts.events.registry import decode_event
from services.ledger.chain import Fact
from services.ledger.decoding import ProgressFact, _plain_progress, decode_fact
from tests.factories import batch_created

SUBJECT = "evt.batch.batch_dec1.progressed"
CHUNK_USAGE = BatchUsage(input_tokens=120, output_tokens=30, total_tokens=150,
                         input_tokens_details=InputTokensDetails(cached_tokens=64))


def published(**fields: object) -> bytes:
    event = BatchProgressed(aggregate_id="batch_dec1", attempt=2, chunk=3, chunk_key="c3", completed=24, failed=1,
                            **fields)
    return event.model_dump_json().encode()


def by_contract(data: bytes) -> ProgressFact | None:
    try:
        event = decode_event(data)
    except ValidationError:
        return None
    assert isinstance(event, BatchProgressed)
    return ProgressFact.of(event)


DROP = object()


def edited(data: bytes, **changes: object) -> bytes:
    """The payload with fields changed (or dropped), written as compactly as a publisher would."""
    payload = json.loads(data) | changes
    return json.dumps({k: v for k, v in payload.items() if v is not DROP}, separators=(",", ":"),
                      ensure_ascii=False).encode()


@pytest.mark.parametrize("data", [published(), published(shard=4), published(causation_id="evt-1"),
                                  published(correlation_id=None), published(usage=CHUNK_USAGE)],
                         ids=["plain", "shard", "caused", "uncorrelated", "usage"])
def test_a_progress_fact_as_published_is_read_without_its_contract_and_to_the_same_values(data: bytes) -> None:
    assert _plain_progress(data) is not None
    assert decode_fact(Fact(1, SUBJECT, data)) == by_contract(data)


@pytest.mark.parametrize("data", [
    edited(published(), completed=24.0),
    edited(published(), completed="24"),
    edited(published(), failed=True),
    edited(published(), completed=2**70),
    edited(published(), chunk_key=DROP),
    edited(published(), attempt=None),
    edited(published(), aggregate_id="batch_dé"),
    edited(published(), aggregate_id='batch_"q"'),
    edited(published(), extra="ignored"),
    orjson.dumps(orjson.loads(published()), option=orjson.OPT_INDENT_2),
    published().replace(b'"shard":0,', b'"shard":0.5,'),
    b'{"type":"batch.progressed",' + published()[1:],
], ids=["float", "text", "bool", "huge", "missing", "null", "unicode", "escaped", "extra", "indented", "fraction",
        "repeated-key"])
def test_a_payload_the_shortcut_does_not_take_is_judged_by_its_contract(data: bytes) -> None:
    assert _plain_progress(data) is None
    assert decode_fact(Fact(1, SUBJECT, data)) == by_contract(data)


def test_another_fact_naming_the_progress_type_in_its_data_is_still_its_own_contract() -> None:
    created = batch_created("batch_dec1", "key_a", "files/file-in", created_at=1, expires_at=2,
                            metadata={"note": '"type":"batch.progressed"'})
    assert decode_fact(Fact(1, "evt.batch.batch_dec1.created", created.model_dump_json().encode())) == created


def test_a_payload_that_is_no_event_is_skipped() -> None:
    assert decode_fact(Fact(1, SUBJECT, b'{"type":"batch.progressed"}')) is None
    assert decode_fact(Fact(1, SUBJECT, b"not json")) is None
