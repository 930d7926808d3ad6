"""A gateway runs for years: what it keeps per owner, key or webhook endpoint goes once it is of no more use, so
tenants who come and go (keys used once, owners who never list, endpoints deleted while failing) leave nothing
behind."""

import asyncio
from typing import Any

import pytest

from contracts.readmodel import ApiKeyRecord, UserRecord
from services.gateway.adapters import key_cache, own_writes
from services.gateway.adapters.key_cache import KeyCache
from services.gateway.adapters.own_writes import OwnWrites
from services.gateway.background import key_usage
from services.gateway.background.key_usage import KeyUsage
from services.gateway.webhooks.fairness import BREAKER_FORGOTTEN_S, Fairness

OWNERS = 50


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def test_read_your_writes_notes_of_owners_who_never_list_are_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    clock, writes = Clock(), OwnWrites()
    monkeypatch.setattr(own_writes.time, "monotonic", clock.monotonic)
    for owner in range(OWNERS):
        for batch in range(20):
            writes.note(f"user_{owner}", "batch", f"batch_{owner}_{batch}")
    assert sum(map(len, writes.pending.values())) == OWNERS * 20

    clock.now += own_writes.KEEP_S + 1
    for number in range(own_writes.SWEEP_EVERY):
        writes.note("user_active", "file", f"file-{number}")
    assert list(writes.pending) == ["user_active"]
    assert writes.awaits("user_active", "file", "file-0")


async def test_keys_used_once_are_not_remembered_past_the_write_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(key_usage.time, "monotonic", clock.monotonic)

    class Bucket:
        async def put(self, key: str, value: bytes) -> None:
            pass

    bucket: Any = Bucket()
    usage = KeyUsage(bucket)
    for number in range(200):
        usage.touch(f"key_{number}")
    clock.now += key_usage.WRITE_EVERY_S
    usage.touch("key_live")
    await asyncio.sleep(0)
    assert list(usage.written) == ["key_live"]


def test_breakers_of_endpoints_no_attempt_reaches_any_more_are_forgotten() -> None:
    fairness = Fairness(owner_limit=4, endpoint_limit=2, breaker_failures=3, cooldown_s=10.0)
    now = 0.0
    for number in range(OWNERS):  # each endpoint fails once, then is deleted: no attempt of it ever again
        fairness.started(f"wh_{number}", "user_a")
        fairness.ended(f"wh_{number}", "user_a", succeeded=False, now=now)
    assert len(fairness.breakers) == OWNERS

    now += BREAKER_FORGOTTEN_S + 1
    fairness.started("wh_new", "user_b")
    fairness.ended("wh_new", "user_b", succeeded=False, now=now)
    assert list(fairness.breakers) == ["wh_new"]


async def test_keys_and_users_no_longer_used_leave_the_auth_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(key_cache.time, "monotonic", clock.monotonic)

    class Reads:
        async def get_api_key(self, digest: str) -> ApiKeyRecord:
            return ApiKeyRecord(key_id=f"key_{digest[:8]}", role="user", label="", user_id=f"user_{digest[:8]}")

        async def get_user(self, user_id: str) -> UserRecord:
            return UserRecord(user_id=user_id, display_name=user_id, created_at=0)

    class NoRevocations:
        async def revoked(self, digest: str, key_id: str) -> bool:
            return False

    reads: Any = Reads()
    revocations: Any = NoRevocations()
    cache = KeyCache(reads, revocations)
    for day in range(10):  # every day (a key's trust at a time), 2,000 tenants come, authenticate, and go
        for number in range(2000):
            await cache.user_of(await cache.lookup(f"sk-{day}-{number}") or pytest.fail("no record"))
        clock.now += key_cache.CACHE_TTL_S

    assert len(cache.known) + len(cache.users) < 3 * 2 * 2000  # a day or two's worth, not ten
    assert len(cache.known) >= 2000  # the last day's keys, trusted until their time is up
