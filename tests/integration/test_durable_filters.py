"""A durable with several filters (the gateways' webhook intake), on faststream against the real nats-server: one
consumer takes facts of several types, each decoded as its own type, with its sequence in the stream; and a consumer
made with those filters before the router declared it is bound as it is, so what it acked then is not taken again
(an upgraded gateway sends no webhook twice)."""

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import Field

from contracts.events.batch import BatchCancelled, BatchValidated
from contracts.events.envelope import Event
from contracts.ids import new_batch_id
from contracts.subjects import EVENTS_STREAM, batch_fact
from services.runtime.nats.bus import ConsumerPolicy, EventBus
from services.runtime.nats.delivery import Durable, ServiceRouter
from services.runtime.process.settings import ConnectionSettings
from tests.integration.durables import durable_subscription
from tests.integration.router_support import serving

Either = Annotated[BatchValidated | BatchCancelled, Field(discriminator="type")]
POLICY = ConsumerPolicy(ack_wait_s=5.0, max_deliver=-1, retry_delays_s=(0.1,))
WAIT_S = 20.0


@dataclass
class Taker:
    taken: list[tuple[Event, int]] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def take(self, fact: Event, sequence: int) -> None:
        self.taken.append((fact, sequence))
        self.arrived.set()

    async def next_one(self) -> tuple[Event, int]:
        await asyncio.wait_for(self.arrived.wait(), WAIT_S)
        self.arrived.clear()
        return self.taken[-1]


def on_both(batch_id: str) -> Durable:
    subjects = (batch_fact(batch_id, "cancelled"), batch_fact(batch_id, "validated"))
    return Durable(Either, EVENTS_STREAM, f"tests-filters-{batch_id}", "", POLICY, filter_subjects=subjects)


def validated(batch_id: str) -> BatchValidated:
    return BatchValidated(aggregate_id=batch_id, total_lines=1, model="m")


def cancelled(batch_id: str) -> BatchCancelled:
    return BatchCancelled(aggregate_id=batch_id, output_file_id=None, error_file_id=None, completed=0, failed=0,
                          usage={"input_tokens": 0, "output_tokens": 0, "total_tokens": 0})


@asynccontextmanager
async def taking(connection: ConnectionSettings, durable: Durable) -> AsyncIterator[tuple[Taker, EventBus]]:
    router = ServiceRouter("tests", dependencies="taker")
    router.durable(durable, Taker.take, None, "under test")
    taker = Taker()
    async with serving(connection.nats_url, router, taker, "tests-filters") as bus:
        yield taker, bus


async def test_one_consumer_takes_each_filters_facts_as_their_own_type_with_their_sequence(
        connection: ConnectionSettings) -> None:
    batch_id = new_batch_id()
    durable = on_both(batch_id)
    first, second = validated(batch_id), cancelled(batch_id)
    async with taking(connection, durable) as (taker, bus):
        at = await bus.publish(first)
        assert await taker.next_one() == (first, at)
        at = await bus.publish(second)
        assert await taker.next_one() == (second, at)
        config = (await bus.js.consumer_info(EVENTS_STREAM, durable.name)).config
    assert (config.filter_subject, config.filter_subjects) == (None, list(durable.filter_subjects))


async def test_the_consumer_made_before_is_bound_with_its_ack_floor_and_what_it_acked_is_not_taken_again(
        connection: ConnectionSettings) -> None:
    batch_id = new_batch_id()
    durable = on_both(batch_id)
    bus = await EventBus.connect(connection.nats_url, "tests-before")
    try:  # before the upgrade: the consumer made and taken from by hand, as the gateway's intake loop did
        before = await durable_subscription(bus, EVENTS_STREAM, durable.name, durable.filter_subjects, POLICY)
        await bus.publish(validated(batch_id))
        [message] = await before.fetch(1, timeout=WAIT_S)
        await message.ack_sync()
        await before.unsubscribe()
    finally:
        await bus.close()
    after = cancelled(batch_id)
    async with taking(connection, durable) as (taker, bus):
        at = await bus.publish(after)
        assert await taker.next_one() == (after, at)
    assert taker.taken == [(after, at)], "the fact acked before the upgrade came again"


async def test_a_payload_that_is_none_of_its_facts_is_dropped_and_the_next_fact_taken(
        connection: ConnectionSettings) -> None:
    batch_id = new_batch_id()
    durable = on_both(batch_id)
    fact = cancelled(batch_id)
    async with taking(connection, durable) as (taker, bus):
        await bus.js.publish(batch_fact(batch_id, "validated"), b'{"type": "batch.completed"}', stream=EVENTS_STREAM)
        at = await bus.publish(fact)
        assert await taker.next_one() == (fact, at)
        info = await bus.js.consumer_info(EVENTS_STREAM, durable.name)
    assert taker.taken == [(fact, at)] and info.num_redelivered == 0, "the payload was taken, or taken again"
