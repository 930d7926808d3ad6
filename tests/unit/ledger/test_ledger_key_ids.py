"""Key ids in the ledger: a new key keeps the random id its `KeyCreated` names; a key from a log written before key
ids were random keeps the id derived from its hash, so an existing data dir replays to the same ids."""

import json

import orjson
from eventsourcing.domain import Aggregate
from eventsourcing.persistence import StoredEvent

from contracts.events.key import KeyCreated, KeyRevoked
from contracts.ids import key_aggregate_id, key_id_for_hash, new_key_id
from services.ledger.aggregates import ApiKey
from services.ledger.application import Ledger
from services.ledger.projection import api_key_record

DIGEST = "d4" * 32


def folded_key(ledger: Ledger, *facts: KeyCreated | KeyRevoked, first: int = 1) -> ApiKey:
    *_, key = ledger.fold(list(enumerate(facts, start=first)))
    assert isinstance(key, ApiKey)
    return key


def test_a_new_key_is_known_by_the_random_id_its_fact_names_and_revoked_under_it(ledger: Ledger) -> None:
    key_id = new_key_id()
    created = KeyCreated(aggregate_id=key_id, key_id=key_id, key_sha256=DIGEST, role="user", label="k",
                         user_id="alice")
    assert created.subject == f"evt.key.{key_id}.created"
    key = folded_key(ledger, created)
    assert api_key_record(key).key_id == key_id and ledger.user_of_key(key_id) == "alice"
    revoke = KeyRevoked(aggregate_id=key_aggregate_id(key_id, DIGEST), key_sha256=DIGEST)
    assert revoke.subject == f"evt.key.{key_id}.revoked"
    assert api_key_record(folded_key(ledger, revoke, first=2)).revoked


def test_a_key_fact_from_before_random_ids_replays_to_the_id_derived_from_its_hash(ledger: Ledger) -> None:
    old = KeyCreated.model_validate_json(orjson.dumps({
        "type": "key.created", "aggregate_id": DIGEST[:32], "key_sha256": DIGEST, "role": "user", "label": "k",
        "user_id": "bob"}))
    assert old.key_id is None and old.public_id == key_id_for_hash(DIGEST)
    key = folded_key(ledger, old)
    assert api_key_record(key).key_id == key_id_for_hash(DIGEST)
    assert ledger.user_of_key(key_id_for_hash(DIGEST)) == "bob"
    # Its revocation goes where its facts already are, the hash prefix, as before.
    assert key_aggregate_id(key_id_for_hash(DIGEST), DIGEST) == DIGEST[:32]
    revoke = KeyRevoked(aggregate_id=DIGEST[:32], key_sha256=DIGEST)
    assert api_key_record(folded_key(ledger, revoke, first=2)).revoked


def test_a_key_snapshot_from_before_key_ids_is_upcast_to_the_derived_id(ledger: Ledger) -> None:
    key = folded_key(ledger, KeyCreated(aggregate_id=DIGEST[:32], key_sha256=DIGEST, role="worker", label="w"))
    assert ledger.snapshots is not None
    snapshot = ledger.mapper.to_stored_event(type(key).Snapshot.take(key))
    state = json.loads(snapshot.state)
    state["state"]["class_version"] = 3
    del state["state"]["key_id"]
    ledger.snapshots.recorder.insert_events([StoredEvent(
        originator_id=snapshot.originator_id, originator_version=snapshot.originator_version,
        topic=snapshot.topic, state=json.dumps(state).encode())])
    reloaded: Aggregate = ledger.repository.get(key.id)
    assert isinstance(reloaded, ApiKey) and reloaded.key_id == key_id_for_hash(DIGEST)


def test_a_repeated_key_fact_with_another_id_keeps_the_first_id(ledger: Ledger) -> None:
    """A stack registers its own keys at every start: a repeat never renames a key."""
    first, again = new_key_id(), new_key_id()
    key = folded_key(ledger, KeyCreated(aggregate_id=first, key_id=first, key_sha256=DIGEST, role="admin", label="a"),
                     KeyCreated(aggregate_id=again, key_id=again, key_sha256=DIGEST, role="admin", label="a"))
    assert api_key_record(key).key_id == first
