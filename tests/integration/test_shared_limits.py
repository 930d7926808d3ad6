"""The shared counts against a real broker: writers racing on one key each count once, entries go with their
window, and a gateway whose broker stops answering decides from its own counts at once, then shares again."""

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator

import pytest

from contracts.subjects import LIMITS_BUCKET
from services.gateway.adapters.shared_state import SharedState, key_of
from services.gateway.http.auth_failures import FailedAuthentications, SharedFailedAuthentications
from services.gateway.http.limits import ControlCallLimiter
from services.runtime.nats.bus import EventBus
from services.runtime.nats.kv import open_bucket
from services.runtime.process.settings import ConnectionSettings
from tests.conftest import RunningNats, pause


async def shared(bus: EventBus, **options: float) -> SharedState:
    return SharedState(await open_bucket(bus, LIMITS_BUCKET), **options)


@pytest.fixture
async def two_buses(connection: ConnectionSettings) -> AsyncIterator[tuple[EventBus, EventBus]]:
    first = await EventBus.connect(connection.nats_url, "tests-limits-1")
    second = await EventBus.connect(connection.nats_url, "tests-limits-2")
    yield first, second
    await first.close()
    await second.close()


async def test_failures_recorded_at_once_through_two_connections_each_count_once(
        two_buses: tuple[EventBus, EventBus]) -> None:
    limiters = [SharedFailedAuthentications(await shared(bus), FailedAuthentications(limit=1000, window_s=60.0))
                for bus in two_buses]
    address = f"10.9.{os.getpid() % 250}.{int(time.time()) % 250}"

    await asyncio.gather(*(limiters[n % 2].record_failure(address, f"gk-{n}") for n in range(60)))

    assert len(await limiters[0].store.read(limiters[0].entry("auth", address)) or []) == 60


async def test_control_calls_racing_through_two_connections_spend_the_burst_exactly(
        two_buses: tuple[EventBus, EventBus]) -> None:
    limiters = [ControlCallLimiter(await shared(bus), rate_per_s=0.001, burst=25)
                for bus in two_buses]
    key_id = f"key_race_{time.time_ns()}"

    waits = await asyncio.gather(*(limiters[n % 2].wait_s(key_id) for n in range(40)))

    assert sum(1 for wait in waits if wait == 0.0) == 25


async def test_an_entry_is_gone_once_its_window_has_passed(bus: EventBus) -> None:
    state = await shared(bus)
    key = key_of("test", f"expiring-{time.time_ns()}")
    await state.put(key, [1.0], ttl_s=1.0)
    assert await state.read(key) == [1.0]
    for _ in range(40):
        if await state.read(key) is None:
            return
        await asyncio.sleep(0.1)
    pytest.fail("the entry outlived its TTL by 3 s")


async def test_with_its_broker_stalled_a_gateway_answers_from_its_own_counts_then_shares_again(
        fresh_nats: RunningNats) -> None:
    bus = await EventBus.connect(fresh_nats.url, "tests-limits-stalled")
    # Asking the stalled broker costs a whole timeout, so a call that did not ask shows in the time it took.
    state = await shared(bus, timeout_s=1.0, retry_after_s=4.0)
    limiter = ControlCallLimiter(state, rate_per_s=0.001, burst=3)
    assert await limiter.wait_s("key_a") == 0.0
    pause(fresh_nats.process.pid)
    try:
        started = time.monotonic()
        first = await limiter.wait_s("key_a")
        first_s = time.monotonic() - started
        started = time.monotonic()
        rest = [await limiter.wait_s("key_a") for _ in range(2)]
        rest_s = time.monotonic() - started
    finally:
        os.kill(fresh_nats.process.pid, signal.SIGCONT)
    assert first == 0.0 and first_s < 2 * state.timeout_s, "one timeout, then this gateway's own bucket"
    assert rest[0] == 0.0 and rest[1] > 0, "its own burst of 3 holds"
    assert rest_s < state.timeout_s, "without asking the stalled broker again"
    await asyncio.sleep(state.retry_after_s + 0.2)
    assert await limiter.wait_s("key_b") == 0.0
    assert await state.read(key_of("calls", "key_b", 0.001, 3)) is not None, "shared again once the broker answers"
    await bus.close()
