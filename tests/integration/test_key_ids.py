"""A key's id and the subjects of its facts tell nothing about the key (issue 27): executors see both, so neither may
carry any function of the key an attacker could test guesses against. Only fact bodies hold its SHA-256."""

import secrets
from pathlib import Path

from aiohttp.test_utils import TestClient

from contracts.events.key import KeyRole
from contracts.events.registry import decode_event
from contracts.ids import hash_api_key
from contracts.subjects import EVENTS_STREAM
from infra.keys import BootstrapKey, choose_admin_key, local_worker_key, register_key
from services.runtime.nats.bus import EventBus
from services.runtime.nats.kv import read_subject
from services.runtime.process.settings import ConnectionSettings
from tests.integration.test_gateway_revocation import Headers, admin_key, gateways, ledger

RUN = 8
"""Hex digits of the key's SHA-256 in a row that, found in an id or subject, would count as sharing."""


def shares_nothing(digest: str, *names: str) -> bool:
    return not any(digest[at:at + RUN] in name for name in names for at in range(len(digest) - RUN + 1))


async def key_subjects(bus: EventBus, digest: str) -> list[str]:
    """The subjects of every key fact in the log that is about the key with this SHA-256."""
    facts = await read_subject(bus.js, EVENTS_STREAM, "evt.key.>")
    return [fact.subject for fact in facts if getattr(decode_event(fact.data), "key_sha256", None) == digest]


async def created(client: TestClient, admin: Headers, path: str, **body: str) -> tuple[str, str]:
    """(the new key's id, its value) as the API answers them."""
    made = await client.post(path, json=body, headers=admin)
    assert made.status == 200, await made.text()
    key = await made.json()
    return key["id"], key["value"]


async def test_user_and_worker_keys_are_known_by_ids_and_subjects_that_share_nothing_with_their_hash(
        connection: ConnectionSettings, bus: EventBus) -> None:
    async with gateways(connection, 1) as (gateway,):
        async with ledger(connection):
            admin = await admin_key(connection)
            user_id = f"u-{secrets.token_hex(4)}"
            assert (await gateway.post("/v1/organization/users", json={"id": user_id}, headers=admin)).status == 200
            user_key = await created(gateway, admin, "/v1/organization/keys", user_id=user_id)
            worker_key = await created(gateway, admin, "/v1/provider/worker_keys", name="fleet")
            assert (await gateway.delete(f"/v1/organization/keys/{user_key[0]}", headers=admin)).status == 200
            assert (await gateway.delete(f"/v1/provider/worker_keys/{worker_key[0]}", headers=admin)).status == 200
    for key_id, value in (user_key, worker_key):
        digest = hash_api_key(value)
        subjects = await key_subjects(bus, digest)
        assert sorted(subjects) == [f"evt.key.{key_id}.created", f"evt.key.{key_id}.revoked"]
        assert shares_nothing(digest, key_id, *subjects), (digest, key_id, subjects)


async def test_the_stacks_own_keys_are_known_by_ids_that_share_nothing_with_their_hash_and_stay_the_same(
        bus: EventBus, tmp_path: Path) -> None:
    """Registered again at every start, the admin and embedded executor's keys keep one id (an HMAC under a secret
    of the data dir), so a start repeats the same fact."""
    admin, worker = choose_admin_key(tmp_path, None), local_worker_key(tmp_path)
    stacks_keys: tuple[tuple[BootstrapKey, KeyRole], ...] = ((admin, "admin"), (worker, "worker"))
    for key, role in stacks_keys:
        await register_key(bus, key, f"{role} (test)", role=role)
        subjects = await key_subjects(bus, key.sha256)
        assert subjects == [f"evt.key.{key.key_id}.created"]
        assert shares_nothing(key.sha256, key.key_id, *subjects)
    assert choose_admin_key(tmp_path, admin.plaintext).key_id == admin.key_id
    assert local_worker_key(tmp_path).key_id == worker.key_id
    elsewhere = tmp_path / "another-stack"
    elsewhere.mkdir()
    assert choose_admin_key(elsewhere, admin.plaintext).key_id != admin.key_id
