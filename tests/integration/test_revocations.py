"""The revocation check reads the fact log: a key counts as revoked once its fact is stored, with no ledger."""

import secrets

from contracts.events.key import KeyRevoked
from contracts.ids import hash_api_key, key_id_for_hash, new_key_id
from contracts.subjects import EVENTS_STREAM
from services.runtime.nats.bus import EventBus
from services.runtime.nats.kv import ensure_direct_reads
from services.runtime.nats.revocations import RevocationCheck, revoked


def new_digest() -> str:
    return hash_api_key(f"gk-{secrets.token_urlsafe(32)}")


async def test_a_key_is_revoked_the_moment_its_fact_is_stored_with_no_ledger_running(bus: EventBus) -> None:
    digest, key_id = new_digest(), new_key_id()
    assert not await revoked(bus, digest, key_id)
    await bus.publish(KeyRevoked(aggregate_id=key_id, key_sha256=digest))
    assert await revoked(bus, digest, key_id)


async def test_a_key_made_before_random_ids_is_revoked_by_its_fact_under_its_hash_prefix(bus: EventBus) -> None:
    digest = new_digest()
    assert not await revoked(bus, digest, key_id_for_hash(digest))
    await bus.publish(KeyRevoked(aggregate_id=digest[:32], key_sha256=digest))
    assert await revoked(bus, digest, key_id_for_hash(digest))


async def test_a_fact_for_another_key_sharing_the_subject_revokes_only_that_key(bus: EventBus) -> None:
    digest, key_id = new_digest(), new_key_id()
    await bus.publish(KeyRevoked(aggregate_id=key_id, key_sha256=new_digest()))
    assert not await revoked(bus, digest, key_id)


async def test_a_direct_get_sees_the_fact_once_its_publish_returns_on_a_single_replica_stream(bus: EventBus) -> None:
    await ensure_direct_reads(bus.js, EVENTS_STREAM)  # as every gateway does at start
    check = await RevocationCheck.open(bus)
    assert check.direct
    for _ in range(20):
        digest, key_id = new_digest(), new_key_id()
        await bus.publish(KeyRevoked(aggregate_id=key_id, key_sha256=digest))
        assert await revoked(bus, digest, key_id, direct=True)


async def test_the_check_remembers_revoked_keys_and_asks_again_about_live_ones(bus: EventBus) -> None:
    check = await RevocationCheck.open(bus)
    digest, key_id = new_digest(), new_key_id()
    assert not await check.revoked(digest, key_id)
    await bus.publish(KeyRevoked(aggregate_id=key_id, key_sha256=digest))
    assert await check.revoked(digest, key_id)
    assert digest in check.known_revoked
