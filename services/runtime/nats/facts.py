"""Reading one fact back from the log: the newest on a subject, for checks that need the fact itself."""

import nats.js.errors

from contracts.events.registry import AnyEvent, decode_event
from contracts.subjects import EVENTS_STREAM
from services.runtime.nats.bus import EventBus


async def last_fact(bus: EventBus, subject: str) -> tuple[int, AnyEvent] | None:
    """The stream sequence and the fact last published on `subject` (no wildcards), or None if there is none."""
    try:
        message = await bus.js.get_last_msg(EVENTS_STREAM, subject)
    except nats.js.errors.NotFoundError:
        return None
    return message.seq or 0, decode_event(message.data or b"")


async def next_fact(bus: EventBus, subject: str, from_sequence: int = 1) -> tuple[int, AnyEvent] | None:
    """The stream sequence and the first fact on `subject` (no wildcards) at or after `from_sequence`, or None."""
    try:
        message = await bus.js.get_msg(EVENTS_STREAM, seq=from_sequence, subject=subject, next=True)
    except nats.js.errors.NotFoundError:
        return None
    return message.seq or 0, decode_event(message.data or b"")
