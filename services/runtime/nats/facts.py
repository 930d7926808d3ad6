"""Reading one fact back from the log (the newest on a subject, or the next after a sequence), for checks that need
the fact itself, or only where it is."""

import nats.js.errors
from nats.js import JetStreamContext

from contracts.events.registry import AnyEvent, decode_event
from contracts.subjects import EVENTS_STREAM
from services.runtime.nats.bus import EventBus


async def last_fact(bus: EventBus, subject: str, direct: bool = False) -> tuple[int, AnyEvent] | None:
    """The stream sequence and the fact last published on `subject` (no wildcards), or None if there is none.
    `direct`: a direct get, which any replica may answer (see revocations.py for when that cannot miss a fact)."""
    try:
        message = await bus.js.get_last_msg(EVENTS_STREAM, subject, direct=direct)
    except nats.js.errors.NotFoundError:
        return None
    return message.seq or 0, decode_event(message.data or b"")


async def last_sequence(js: JetStreamContext, subject: str) -> int | None:
    """The stream sequence of the last fact on `subject` (a filter may have wildcards), or None if there is none."""
    try:
        return (await js.get_last_msg(EVENTS_STREAM, subject)).seq or 0
    except nats.js.errors.NotFoundError:
        return None


async def next_fact(bus: EventBus, subject: str, from_sequence: int = 1) -> tuple[int, AnyEvent] | None:
    """The stream sequence and the first fact on `subject` (no wildcards) at or after `from_sequence`, or None."""
    try:
        message = await bus.js.get_msg(EVENTS_STREAM, seq=from_sequence, subject=subject, next=True)
    except nats.js.errors.NotFoundError:
        return None
    return message.seq or 0, decode_event(message.data or b"")
