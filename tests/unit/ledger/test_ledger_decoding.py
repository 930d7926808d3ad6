"""The fold's decoding: a progress fact read straight from its JSON is exactly what its contract would make of it,
and every payload the shortcut does not take is judged by the contract as before."""

import json

import orjson
import pytest
from pydantic import ValidationError

from contracts.api.batch import BatchUsage, InputTokensDetails
from contracts.events.batch import BatchCreated, BatchProgressed, BatchValidated
from contracts.events.envelope import Event
from contracts.events.registry import decode_event
from services.ledger.application import Ledger, persistence_env
from services.ledger.chain import Fact
from services.ledger.decoding import ProgressFact, _plain_progress, decode_fact
from services.ledger.projection import batch_record
from tests.factories import batch_created, batch_life

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


def test_a_log_of_version_1_batch_facts_folds_to_the_same_batch_as_version_2() -> None:
    """Facts stated before a batch's terms were nested (each term a field of `batch.created`, three restated in
    `batch.validated`) still fold, to the very batch the same life stated today folds to."""
    def first_shape(event: Event) -> dict[str, object]:
        data = json.loads(event.model_dump_json())
        if isinstance(event, BatchCreated):
            data |= data.pop("terms") | {"version": 1}
        elif isinstance(event, BatchValidated):
            data |= {"version": 1, "owner_key_id": "key_test", "endpoint": "/v1/chat/completions",
                     "input_object_key": "files/file-in"}
        return data

    life = batch_life("batch_dec2", 3, lines_per_chunk=2, tokens_per_line=(3, 4))
    records = []
    for shape in (first_shape, lambda event: json.loads(event.model_dump_json())):
        ledger = Ledger(persistence_env(None))
        ledger.fold_facts([Fact(n, event.subject, json.dumps(shape(event)).encode())
                           for n, event in enumerate(life, 1)])
        batch = ledger.batch("batch_dec2")
        assert batch is not None
        records.append(batch_record(batch))
        ledger.close()
    assert records[0] == records[1] and records[0].batch.status == "completed"
