"""Helpers tests share: reading a batch's facts back from the real EVENTS stream."""

import asyncio
from collections.abc import Callable

import nats.errors
from nats.js.api import DeliverPolicy

from contracts.events.registry import AnyEvent, decode_event
from contracts.subjects import batch_events
from services.runtime.bus import EventBus


async def batch_facts(bus: EventBus, batch_id: str, until: Callable[[AnyEvent], bool],
                      timeout_s: float = 60.0) -> list[AnyEvent]:
    """Every event of the batch, in stream order, up to and including the first one `until` accepts."""
    subscription = await bus.js.subscribe(batch_events(batch_id), ordered_consumer=True,
                                          deliver_policy=DeliverPolicy.ALL)
    facts: list[AnyEvent] = []
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                try:
                    message = await subscription.next_msg(timeout=1.0)
                except nats.errors.TimeoutError:
                    continue
                facts.append(decode_event(message.data))
                if until(facts[-1]):
                    return facts
    finally:
        await subscription.unsubscribe()
