"""Helpers tests share: reading a batch's facts back from the real EVENTS stream."""

import asyncio
from collections.abc import Callable
from contextlib import aclosing

from contracts.events.registry import AnyEvent, decode_event
from contracts.subjects import batch_events
from services.runtime.nats import eventlog
from services.runtime.nats.bus import EventBus


async def batch_facts(bus: EventBus, batch_id: str, until: Callable[[AnyEvent], bool],
                      timeout_s: float = 60.0) -> list[AnyEvent]:
    """Every event of the batch, in stream order, up to and including the first one `until` accepts."""
    facts: list[AnyEvent] = []
    async with asyncio.timeout(timeout_s), aclosing(eventlog.follow(bus, batch_events(batch_id))) as log:
        async for arrived in log:
            for fact in arrived:
                facts.append(decode_event(fact.data))
                if until(facts[-1]):
                    return facts
    raise AssertionError("the log ended")  # follow never ends
