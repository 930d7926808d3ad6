"""What a tenant or an executor chose is read back from the ledger's store as it was written: a batch's metadata
shaped like eventsourcing's own encoding of a custom type (`{"_type_": …, "_data_": …}`), or failure codes named
`_type_` and `_data_`, neither make the batch unreadable (which stopped every later fold of it, after a restart or a
cache miss) nor come back as a Decimal, a UUID or a datetime; and everything else is written byte for byte as
eventsourcing writes it."""

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from eventsourcing.application import Application
from eventsourcing.persistence import JSONTranscoder

from contracts.events.batch import AttemptFailed, BatchAssigned, BatchCancelRequested, BatchStarted, BatchValidated
from contracts.events.envelope import Event
from contracts.readmodel import BatchRecord
from services.ledger.application import Ledger, persistence_env
from services.ledger.chain import Fact
from services.ledger.projection import folded_records
from services.ledger.transcoding import LedgerTranscoder
from tests.factories import batch_created

BATCH = "batch_0123456789abcdef01234567"
SHAPES = [{"_type_": "nope", "_data_": "x"}, {"_type_": "uuid_hex", "_data_": "zz"},
          {"_type_": "decimal_str", "_data_": "1"}, {"_type_": "datetime_iso", "_data_": "2026-01-01T00:00:00"},
          {"_type_": "plain_dict", "_data_": "[]"}, {"_type_": "x"}]


def stock() -> JSONTranscoder:
    transcoder = JSONTranscoder()
    Application.register_transcodings(Application.__new__(Application), transcoder)
    return transcoder


def ours() -> LedgerTranscoder:
    transcoder = LedgerTranscoder()
    Application.register_transcodings(Application.__new__(Application), transcoder)
    return transcoder


def facts(events: list[Event], first: int = 1) -> list[Fact]:
    return [Fact(sequence, event.subject, event.model_dump_json().encode())
            for sequence, event in enumerate(events, first)]


def batch_of(records: list[Any]) -> BatchRecord:
    [record] = [record for record in records if isinstance(record, BatchRecord)]
    return record


@pytest.mark.parametrize("metadata", SHAPES)
def test_metadata_shaped_like_a_custom_type_reads_back_as_written_after_a_restart(
        tmp_path: Path, metadata: dict[str, str]) -> None:
    created = batch_created(BATCH).model_copy(update={"metadata": metadata})
    ledger = Ledger(persistence_env(tmp_path / "ledger.sqlite"))
    folded_records(ledger, facts([created]))
    ledger.close()

    restarted = Ledger(persistence_env(tmp_path / "ledger.sqlite"))  # nothing cached: the batch is read back
    record = batch_of(folded_records(restarted, facts([BatchValidated(aggregate_id=BATCH, total_lines=1,
                                                                      model="m")], first=2)))
    restarted.close()
    assert record.batch.metadata == metadata and record.batch.status == "validated"


def test_codes_an_executor_chose_survive_a_snapshot(tmp_path: Path) -> None:
    """A failure coded `_type_` and one coded `_data_` make the batch's counts_by_code a two-key dict of those keys;
    once a snapshot holds it (every 100th event), the batch must still load."""
    events: list[Event] = [batch_created(BATCH), BatchValidated(aggregate_id=BATCH, total_lines=1, model="m",
                                                                error_count=0, counts_by_code={})]
    for attempt, code in ((1, "_type_"), (2, "_data_")):
        events += [BatchAssigned(aggregate_id=BATCH, executor_id="exec-1", attempt=attempt, lease_token="t"),
                   BatchStarted(aggregate_id=BATCH, executor_id="exec-1", attempt=attempt, engine="llamacpp",
                                engine_version="1"),
                   AttemptFailed(aggregate_id=BATCH, attempt=attempt, executor_id="exec-1", code=code, reason="r")]
    events += [BatchCancelRequested(aggregate_id=BATCH, requested_by_key_id=f"key_{n}") for n in range(110)]
    ledger = Ledger(persistence_env(tmp_path / "ledger.sqlite"))
    for fact in facts(events):  # a group per fact, so the batch passes its 100th event and is snapshotted
        folded_records(ledger, [fact])
    ledger.close()

    restarted = Ledger(persistence_env(tmp_path / "ledger.sqlite"))
    record = batch_of(folded_records(restarted, facts([BatchCancelRequested(aggregate_id=BATCH,
                                                                            requested_by_key_id="key_late")],
                                                      first=len(events) + 1)))
    restarted.close()
    assert record.batch.id == BATCH


NESTED: dict[str, Any] = {"a": [{"_type_": "nope", "_data_": {"_type_": "uuid_hex", "_data_": "zz"}}],
                          "b": {"_type_": "decimal_str", "c": ({"_type_": "t", "_data_": 1},)},
                          "when": datetime(2026, 12, 6, tzinfo=UTC), "id": uuid4(), "price": Decimal("1.5")}


def test_any_dict_with_a_type_key_round_trips_at_any_depth_beside_real_custom_types() -> None:
    transcoder = ours()
    read = transcoder.decode(transcoder.encode(NESTED))
    assert read["a"] == NESTED["a"] and read["b"] == {"_type_": "decimal_str", "c": [{"_type_": "t", "_data_": 1}]}
    assert (read["when"], read["id"], read["price"]) == (NESTED["when"], NESTED["id"], NESTED["price"])


def test_everything_else_is_written_exactly_as_eventsourcing_writes_it() -> None:
    plain = {"status": "validated", "when": datetime(2026, 12, 6, tzinfo=UTC), "id": uuid4(), "list": [1, "two"],
             "metadata": {"type": "_type_", "note": "_type_ in a value is text"}, "times": {"created_at": 1}}
    assert ours().encode(plain) == stock().encode(plain)
