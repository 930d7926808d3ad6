"""Composition root of the scheduler: connect, then assign validated batches until stopped."""

import asyncio

from contracts.subjects import BATCH_VALIDATED, EVENTS_STREAM, SCHEDULER_DURABLE
from services.runtime.bus import ConsumerPolicy, EventBus
from services.runtime.catalogue import load_catalogue
from services.runtime.fleet import Fleet
from services.scheduler.handlers import Scheduler
from services.scheduler.settings import SchedulerSettings

UNLIMITED_DELIVERIES = -1
"""A batch waiting for an executor is retried for as long as it takes, with a bounded delay."""


async def run_scheduler(settings: SchedulerSettings, stop: asyncio.Event) -> None:
    connection = settings.connection
    bus = await EventBus.connect(connection.nats_url, "scheduler")
    scheduler = Scheduler(bus=bus, fleet=await Fleet.open(bus), catalogue=load_catalogue(connection.catalogue_path))
    policy = ConsumerPolicy(ack_wait_s=30, max_deliver=UNLIMITED_DELIVERIES,
                            retry_delays_s=(settings.retry_unassignable_s,))
    try:
        await bus.consume(EVENTS_STREAM, SCHEDULER_DURABLE, [BATCH_VALIDATED], scheduler.on_message, policy,
                          scheduler.on_poison, stop)
    finally:
        await bus.close()
