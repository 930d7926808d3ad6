"""Stored ledger events and snapshots written by an older ledger (class version 1) still load, upcast."""

import json

from eventsourcing.domain import Aggregate
from eventsourcing.persistence import StoredEvent

from services.ledger.application import Ledger
from services.ledger.domainmodel import Batch
from services.ledger.folded import TOPIC_MODULE
from tests.unit.ledger.test_ledger_domain import BATCH, Stream, created, started, validated


def test_a_v1_progressed_event_in_the_store_is_upcast_with_its_attempt_unknown(ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(created(), validated(), started())
    batch = stream.batch()
    v1_state = {"timestamp": {"_type_": "datetime_iso", "_data_": "2023-11-14T22:13:20+00:00"},
                "sequence": 4, "completed": 7, "failed": 1}
    ledger.recorder.insert_events([StoredEvent(
        originator_id=batch.id, originator_version=batch.version + 1, topic=f"{TOPIC_MODULE}:Batch.Progressed",
        state=json.dumps(v1_state).encode())])

    reloaded = stream.batch()
    assert (reloaded.completed, reloaded.failed, reloaded.version) == (7, 1, batch.version + 1)
    *_, progressed = ledger.events.get(batch.id)
    assert progressed.attempt == 0  # type: ignore[attr-defined]


def test_a_v1_batch_snapshot_is_upcast_with_the_fields_added_since(ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(created(), validated())
    batch = stream.batch()
    assert ledger.snapshots is not None
    snapshot = ledger.mapper.to_stored_event(type(batch).Snapshot.take(batch))
    state = json.loads(snapshot.state)
    for added in ("attempt_failures", "cancel_requested_by", "class_version"):
        del state["state"][added]
    ledger.snapshots.recorder.insert_events([StoredEvent(
        originator_id=snapshot.originator_id, originator_version=snapshot.originator_version,
        topic=snapshot.topic, state=json.dumps(state).encode())])

    reloaded: Aggregate = ledger.repository.get(batch.id)
    assert isinstance(reloaded, Batch)
    assert (reloaded.attempt_failures, reloaded.cancel_requested_by) == ([], None)
    assert reloaded.status == "validated" and reloaded.batch_id == BATCH


def test_stored_validation_verdicts_from_before_the_true_totals_still_fold(ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(created())
    batch = stream.batch()
    old_state = {"timestamp": {"_type_": "datetime_iso", "_data_": "2023-11-14T22:13:20+00:00"},
                 "sequence": 2, "at": 1, "total_lines": 4, "error_count": 3, "counts_by_code": {"invalid_json": 3}}
    ledger.recorder.insert_events([StoredEvent(
        originator_id=batch.id, originator_version=batch.version + 1, topic=f"{TOPIC_MODULE}:Batch.ValidationFailed",
        state=json.dumps(old_state).encode())])

    reloaded = stream.batch()
    assert (reloaded.status, reloaded.error_total, reloaded.error_file_id) == ("failed", 3, None)
    assert reloaded.status_reason == "validation found 3 errors in 4 input lines"
