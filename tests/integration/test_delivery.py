"""The one delivery policy of declared subscriptions, on faststream against the real nats-server: ack after the
handler, backoff retries, a long handler keeps its lease, a hopeless fact goes to the poison handler once."""

import asyncio
import errno
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest

from contracts.events.batch import BatchCreated
from contracts.ids import new_batch_id
from contracts.subjects import EVENTS_STREAM, batch_fact
from services.runtime.nats.bus import ConsumerPolicy, EventBus, NotYet, PoisonMessage
from services.runtime.nats.delivery import Durable, ServiceRouter
from services.runtime.process.settings import ConnectionSettings
from tests.factories import batch_created

FAST = ConsumerPolicy(ack_wait_s=1.0, max_deliver=3, retry_delays_s=(0.1, 0.2))


@dataclass
class Probe:
    """What the handler under test does on each delivery, and what it and the poison handler saw."""

    behaviour: Callable[[int], Awaitable[None]]
    deliveries: list[str] = field(default_factory=list)
    delivered_at: list[float] = field(default_factory=list)
    poisoned: list[tuple[BatchCreated, str]] = field(default_factory=list)
    recording_fails: list[BaseException] = field(default_factory=list)
    """What the poison handler raises on its next calls, one each (then it records)."""
    recording_tries: int = 0


async def handle(probe: Probe, created: BatchCreated) -> None:
    probe.deliveries.append(created.aggregate_id)
    probe.delivered_at.append(time.monotonic())
    await probe.behaviour(len(probe.deliveries))


async def record_poison(probe: Probe, created: BatchCreated, error: BaseException) -> None:
    probe.recording_tries += 1
    if probe.recording_fails:
        raise probe.recording_fails.pop(0)
    probe.poisoned.append((created, repr(error)))


def created(batch_id: str) -> BatchCreated:
    return batch_created(batch_id, "key_test", "files/file_x", created_at=0, expires_at=86400)


@asynccontextmanager
async def subscribed(connection: ConnectionSettings, behaviour: Callable[[int], Awaitable[None]],
                     batch_id: str = "") -> AsyncIterator[tuple[Probe, EventBus, str]]:
    """A durable of its own on one (fresh) batch's `created` subject, handled by `handle` under `FAST`."""
    batch_id = batch_id or new_batch_id()
    router = ServiceRouter("tests", dependencies="probe")
    router.durable(Durable(BatchCreated, EVENTS_STREAM, f"tests-{batch_id}", batch_fact(batch_id, "created"), FAST),
                   handle, record_poison, "under test")
    bus = await EventBus.connect(connection.nats_url, "tests")
    broker = bus.broker
    broker.include_router(router)
    probe = Probe(behaviour)
    broker.context.set_global("probe", probe)
    await broker.start()
    try:
        yield probe, bus, batch_id
    finally:
        await broker.stop()


async def settle(seconds: float = 2.5) -> None:
    """Long enough for every redelivery the policy allows (ack wait and backoff) to have happened."""
    await asyncio.sleep(seconds)


async def nothing(_: int) -> None:
    return None


async def test_a_handled_fact_is_acked_and_never_delivered_again(connection: ConnectionSettings) -> None:
    async with subscribed(connection, nothing) as (probe, bus, batch_id):
        await bus.publish(created(batch_id))
        await settle()
    assert probe.deliveries == [batch_id] and probe.poisoned == []


async def test_a_failing_handler_is_retried_with_backoff_until_it_succeeds(connection: ConnectionSettings) -> None:
    async def fail_twice(delivery: int) -> None:
        if delivery < 3:
            raise ConnectionError("the object store is down")

    async with subscribed(connection, fail_twice) as (probe, bus, batch_id):
        await bus.publish(created(batch_id))
        await settle()
    assert probe.deliveries == [batch_id] * 3 and probe.poisoned == []
    gaps = [later - earlier for earlier, later in zip(probe.delivered_at, probe.delivered_at[1:], strict=False)]
    assert all(delay <= gap < FAST.ack_wait_s for delay, gap in zip(FAST.retry_delays_s, gaps, strict=True))


async def test_a_handler_waiting_for_something_on_its_way_is_retried_and_said_at_info(
        connection: ConnectionSettings, caplog: pytest.LogCaptureFixture) -> None:
    async def not_yet_once(delivery: int) -> None:
        if delivery < 2:
            raise NotYet("the ledger has not folded the batch yet")

    caplog.set_level(logging.INFO, logger="services.runtime.nats.delivery")
    async with subscribed(connection, not_yet_once) as (probe, bus, batch_id):
        await bus.publish(created(batch_id))
        await settle()
    assert probe.deliveries == [batch_id] * 2 and probe.poisoned == []
    said = [record for record in caplog.records if "handler failed" in record.getMessage()]
    assert [record.levelno for record in said] == [logging.INFO]


async def test_a_handler_failing_on_its_last_delivery_hands_the_decoded_fact_to_the_poison_handler(
        connection: ConnectionSettings) -> None:
    async def always_fail(_: int) -> None:
        raise ConnectionError("the object store is down")

    async with subscribed(connection, always_fail) as (probe, bus, batch_id):
        await bus.publish(created(batch_id))
        await settle(4.0)
    assert probe.deliveries == [batch_id] * FAST.max_deliver
    assert [(fact and fact.aggregate_id, error) for fact, error in probe.poisoned] == [
        (batch_id, "ConnectionError('the object store is down')")]


async def test_recording_a_fact_given_up_on_its_last_delivery_is_retried_through_a_write_fault(
        connection: ConnectionSettings) -> None:
    async def always_fail(_: int) -> None:
        raise ConnectionError("the object store is down")

    async with subscribed(connection, always_fail) as (probe, bus, batch_id):
        probe.recording_fails = [OSError(errno.ENOSPC, "No space left on device")] * 2
        await bus.publish(created(batch_id))
        await settle(4.0)
    assert probe.recording_tries == 3 and len(probe.poisoned) == 1


async def test_recording_that_fails_for_another_reason_on_the_last_delivery_is_not_retried_for_ever(
        connection: ConnectionSettings) -> None:
    async def always_fail(_: int) -> None:
        raise ConnectionError("the object store is down")

    async with subscribed(connection, always_fail) as (probe, bus, batch_id):
        probe.recording_fails = [PermissionError("the attempt is fenced")] * 100
        await bus.publish(created(batch_id))
        await settle(4.0)
        tries = probe.recording_tries
        await settle(1.0)
    assert tries == 1 and probe.recording_tries == 1 and probe.poisoned == []


async def test_a_poison_message_is_given_up_on_at_its_first_delivery(connection: ConnectionSettings) -> None:
    async def hopeless(_: int) -> None:
        raise PoisonMessage("the input file is gone")

    async with subscribed(connection, hopeless) as (probe, bus, batch_id):
        await bus.publish(created(batch_id))
        await settle()
    assert probe.deliveries == [batch_id] and len(probe.poisoned) == 1


@pytest.mark.parametrize("payload", [b'{"type": "batch.created"}', b"not JSON", b'{"aggregate_id": 7}'])
async def test_a_payload_that_is_not_its_contract_is_logged_and_dropped_by_the_router_without_retries(
        connection: ConnectionSettings, payload: bytes, caplog: pytest.LogCaptureFixture) -> None:
    async with subscribed(connection, nothing) as (probe, bus, batch_id):
        await bus.js.publish(batch_fact(batch_id, "created"), payload, stream=EVENTS_STREAM)
        await settle()
        info = await bus.js.consumer_info(EVENTS_STREAM, f"tests-{batch_id}")
    assert probe.deliveries == [] and probe.poisoned == []  # the poison handler only ever sees a decoded fact
    assert info.num_pending == 0 and info.num_ack_pending == 0 and info.num_redelivered == 0
    assert any("is not a BatchCreated" in record.getMessage() and batch_id in record.getMessage()
               for record in caplog.records)


async def test_a_handler_running_past_its_ack_wait_keeps_its_lease(connection: ConnectionSettings) -> None:
    async def slow(_: int) -> None:
        await asyncio.sleep(3 * FAST.ack_wait_s)

    async with subscribed(connection, slow) as (probe, bus, batch_id):
        await bus.publish(created(batch_id))
        await settle(4.5)
    assert probe.deliveries == [batch_id] and probe.poisoned == []


async def test_a_fact_published_before_the_subscriber_started_is_delivered(connection: ConnectionSettings) -> None:
    batch_id = new_batch_id()
    early = await EventBus.connect(connection.nats_url, "tests")
    await early.publish(created(batch_id))
    await early.close()
    async with subscribed(connection, nothing, batch_id) as (probe, _, _):
        await settle(1.5)
    assert probe.deliveries == [batch_id]
