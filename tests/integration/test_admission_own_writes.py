"""An owner's admission starts from this gateway's own last write of their entry, against a real broker: one write and
no read while no other gateway wrote it; another gateway's admission in between is found and counted; a refusal is
decided from a fresh read of the entry; an item this gateway saw the read model show is known without a lookup; the
counts' writes (rate limits) evict nothing admission remembers."""

import time
from collections.abc import AsyncIterator

import pytest

from contracts.subjects import LIMITS_BUCKET
from services.gateway.adapters import shared_state
from services.gateway.adapters.admission import Admission, Holdings
from services.gateway.adapters.shared_state import SharedState, key_of
from services.runtime.nats.bus import EventBus
from services.runtime.nats.kv import open_bucket
from services.runtime.process.settings import ConnectionSettings

LIMIT = 3


class CountedReads(SharedState):
    reads = 0

    async def get_raw(self, key: str) -> tuple[bytes | None, int]:
        self.reads += 1
        return await super().get_raw(key)


async def nothing_shown(listed: frozenset[str]) -> Holdings:
    """A read model that shows none of the owner's items yet: every admitted one is still pending."""
    return Holdings({}, frozenset())


@pytest.fixture
async def two_gateways(connection: ConnectionSettings) -> AsyncIterator[tuple[CountedReads, CountedReads]]:
    buses = [await EventBus.connect(connection.nats_url, f"tests-own-writes-{n}") for n in (1, 2)]
    first, second = [CountedReads(await open_bucket(bus, LIMITS_BUCKET)) for bus in buses]
    yield first, second
    for bus in buses:
        await bus.close()


async def test_an_owner_this_gateway_admitted_last_is_admitted_again_with_one_write_and_no_read(
        two_gateways: tuple[CountedReads, CountedReads]) -> None:
    store, _ = two_gateways
    owner = f"user-own-{time.time_ns()}"
    admission = Admission(store)

    assert [await admission.take("test", owner, f"item-{n}", 1, LIMIT, nothing_shown) for n in range(LIMIT)] \
        == [None] * LIMIT

    assert store.reads == 1  # the first admission only


async def test_another_gateways_admission_in_between_is_found_and_counted(
        two_gateways: tuple[CountedReads, CountedReads]) -> None:
    first, second = (Admission(store) for store in two_gateways)
    owner = f"user-both-{time.time_ns()}"

    assert await first.take("test", owner, "a", 1, LIMIT, nothing_shown) is None
    assert await second.take("test", owner, "b", 1, LIMIT, nothing_shown) is None
    assert await first.take("test", owner, "c", 1, LIMIT, nothing_shown) is None  # its last write is not the entry's
    assert await first.take("test", owner, "d", 1, LIMIT, nothing_shown) == LIMIT  # b counted: the limit is reached


async def test_a_refusal_is_decided_from_a_fresh_read_of_the_entry(
        two_gateways: tuple[CountedReads, CountedReads]) -> None:
    first, second = two_gateways
    owner = f"user-refused-{time.time_ns()}"
    admission = Admission(first)
    for n in range(LIMIT):
        assert await admission.take("test", owner, f"item-{n}", 1, LIMIT, nothing_shown) is None
    for n in range(LIMIT):  # released through another gateway (their creates failed before publishing)
        await Admission(second).release("test", owner, f"item-{n}")
    reads = first.reads

    assert await admission.take("test", owner, "next", 1, LIMIT, nothing_shown) is None  # not refused from its own

    assert first.reads == reads + 1


async def test_items_this_gateway_saw_the_read_model_show_are_known_without_a_lookup(
        two_gateways: tuple[CountedReads, CountedReads]) -> None:
    store, _ = two_gateways
    owner = f"user-shown-{time.time_ns()}"
    admission = Admission(store)
    looked_up: list[frozenset[str]] = []

    async def read(listed: frozenset[str]) -> Holdings:
        looked_up.append(listed)
        return Holdings({}, frozenset())  # what the read model counts is not this test's concern

    for item in ("a", "b"):
        assert await admission.take("test", owner, item, 1, LIMIT, read) is None
        admission.shown(item)  # its create read its record back

    assert [await admission.take("test", owner, item, 1, LIMIT, read) for item in "cde"] == [None] * LIMIT
    assert all(not listed & {"a", "b"} for listed in looked_up)


async def test_a_burst_of_rate_limit_writes_leaves_what_admission_remembers_intact(
        two_gateways: tuple[CountedReads, CountedReads], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared_state, "MAX_WRITTEN", 10)
    store, _ = two_gateways
    owner = f"user-burst-{time.time_ns()}"
    admission = Admission(store)
    assert await admission.take("test", owner, "a", 1, LIMIT, nothing_shown) is None

    for n in range(50):  # control calls and failed authentications of many others, through this gateway
        await store.put(key_of("calls", f"key-{n}-{time.time_ns()}"), [1.0], ttl_s=60.0)
    assert await admission.take("test", owner, "b", 1, LIMIT, nothing_shown) is None

    assert store.reads == 1  # the first admission only: its own last write was still remembered
