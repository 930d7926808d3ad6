"""Organisations, and ownership by user: how the ledger folds them and what it projects for the gateway."""

import json
from pathlib import Path

import orjson
from eventsourcing.domain import Aggregate
from eventsourcing.persistence import StoredEvent

from contracts.events.batch import BatchCreated
from contracts.events.file import FileStored
from contracts.events.key import KeyCreated, UserCreated
from contracts.events.organization import OrganizationCreated
from contracts.ids import key_id_for_hash
from contracts.readmodel import BatchRecord, FileRecord, OrganizationRecord
from services.ledger.aggregates import User
from services.ledger.application import Ledger, persistence_env
from services.ledger.folded import Folded
from services.ledger.projection import project, user_record
from tests.factories import batch_created

T0 = 1_700_000_000
LAPTOP, PHONE, LONE = "a1" * 32, "b2" * 32, "c3" * 32


def key(sha: str, user_id: str | None) -> KeyCreated:
    return KeyCreated(aggregate_id=sha[:32], key_sha256=sha, role="user", label="k", user_id=user_id)


def stored(file_id: str, key_sha: str) -> FileStored:
    return FileStored(aggregate_id=file_id, owner_key_id=key_id_for_hash(key_sha), filename="in.jsonl",
                      purpose="batch", bytes=10, sha256="cd" * 32, object_key=f"files/{file_id}", created_at=T0)


def created(batch_id: str, key_sha: str) -> BatchCreated:
    return batch_created(batch_id, key_id_for_hash(key_sha), "files/f1", created_at=T0, expires_at=T0 + 86400)


def projected(ledger: Ledger, aggregate: Folded | None) -> object:
    assert aggregate is not None
    return project(aggregate, ledger.user_of_key)


def test_an_organization_is_folded_and_projected(ledger: Ledger) -> None:
    (organization,) = ledger.fold([(1, OrganizationCreated(aggregate_id="acme", display_name="Acme",
                                                           occurred_at=T0 * 1000))])
    assert projected(ledger, organization) == OrganizationRecord(organization_id="acme", display_name="Acme",
                                                                 created_at=T0)


def test_a_user_belongs_to_the_organization_it_was_created_in(ledger: Ledger) -> None:
    (user,) = ledger.fold([(1, UserCreated(aggregate_id="alice", organization_id="acme"))])
    assert isinstance(user, User) and user_record(user).organization_id == "acme"


def test_a_user_created_before_organizations_existed_is_in_the_default_one(ledger: Ledger) -> None:
    old = UserCreated.model_validate_json(orjson.dumps({"type": "user.created", "aggregate_id": "bob"}))
    assert old.organization_id is None
    (user,) = ledger.fold([(1, old)])
    assert isinstance(user, User) and user_record(user).organization_id is None


def test_a_v1_user_snapshot_is_upcast_into_the_default_organization(ledger: Ledger) -> None:
    (user,) = ledger.fold([(1, UserCreated(aggregate_id="carol", display_name="Carol"))])
    assert ledger.snapshots is not None
    snapshot = ledger.mapper.to_stored_event(type(user).Snapshot.take(user))
    state = json.loads(snapshot.state)
    for added in ("organization_id", "class_version"):
        del state["state"][added]
    ledger.snapshots.recorder.insert_events([StoredEvent(
        originator_id=snapshot.originator_id, originator_version=snapshot.originator_version,
        topic=snapshot.topic, state=json.dumps(state).encode())])
    reloaded: Aggregate = ledger.repository.get(user.id)
    assert isinstance(reloaded, User)
    assert (reloaded.organization_id, reloaded.display_name) == (None, "Carol")


def test_what_any_key_of_a_user_creates_belongs_to_the_user(ledger: Ledger) -> None:
    ledger.fold([(1, UserCreated(aggregate_id="alice")), (2, key(LAPTOP, "alice")), (3, key(PHONE, "alice"))])
    file, batch = ledger.fold([(4, stored("f1", LAPTOP)), (5, created("b1", PHONE))])
    file_record, batch_record = projected(ledger, file), projected(ledger, batch)
    assert isinstance(file_record, FileRecord) and isinstance(batch_record, BatchRecord)
    assert (file_record.owner_key_id, file_record.owner_user_id) == (key_id_for_hash(LAPTOP), "alice")
    assert (batch_record.owner_key_id, batch_record.owner_user_id) == (key_id_for_hash(PHONE), "alice")
    assert file_record.owner == batch_record.owner == "user-alice"


def test_what_a_key_without_a_user_creates_belongs_to_that_key_alone(ledger: Ledger) -> None:
    ledger.fold([(1, key(LONE, None))])
    (file,) = ledger.fold([(2, stored("f1", LONE))])
    record = projected(ledger, file)
    assert isinstance(record, FileRecord) and record.owner_user_id is None
    assert record.owner == f"key-{key_id_for_hash(LONE)}"


def test_a_key_and_what_it_creates_in_the_same_group_are_owned_by_its_user(ledger: Ledger) -> None:
    touched = ledger.fold([(1, key(LAPTOP, "alice")), (2, stored("f1", LAPTOP))])
    (record,) = [r for r in (projected(ledger, a) for a in touched) if isinstance(r, FileRecord)]
    assert record.owner == "user-alice"


def test_a_repeated_key_fact_keeps_the_first_user(ledger: Ledger) -> None:
    first = key(LAPTOP, "alice")
    ledger.fold([(1, first), (2, first.model_copy(update={"event_id": "again", "user_id": "mallory"}))])
    assert ledger.user_of_key(key_id_for_hash(LAPTOP)) == "alice"


def test_the_key_to_user_mapping_outlives_a_restart(tmp_path: Path) -> None:
    env = persistence_env(tmp_path / "ledger.sqlite")
    first = Ledger(env)
    first.fold([(1, key(LAPTOP, "alice"))])
    first.close()
    again = Ledger(env)
    try:
        (batch,) = again.fold([(2, created("b1", LAPTOP))])
        record = projected(again, batch)
        assert isinstance(record, BatchRecord) and record.owner == "user-alice"
    finally:
        again.close()
