"""The one way to read EVENTS (or a filter of it) in stream order: `read` to the head, a `page` at a time, or
`follow` it live. "Caught up" means the stream's last sequence as asked when a read begins (for a `page`: no more
follow, for a reader that may not ask for the head). `read` and `page` use batched direct gets (no consumer left
behind, no quiet spell cuts them short); `follow` is the gap-detecting pull reader (follower.py)."""

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from datetime import datetime

import nats.js.errors
import orjson

from contracts.subjects import EVENTS_STREAM, EVENTS_SUBJECTS, direct_get
from services.runtime.nats.bus import EventBus
from services.runtime.nats.facts import last_sequence
from services.runtime.nats.follower import Fact, OrderedReader
from services.runtime.nats.kv import read_page

__all__ = ["Fact", "follow", "following", "head", "page", "published_at", "read"]

PAGE = 1000
PAGE_BYTES = 8 << 20
PUBLISHED_AT = "Nats-Time-Stamp"
"""The header a direct get puts on each message: when the stream stored it (RFC 3339)."""
START_TIMEOUT_S = 10.0


async def head(bus: EventBus, subjects: tuple[str, ...] = ()) -> int:
    """The sequence of the stream's last fact now (0 while it holds none; with `subjects`, a fold's filters: the last
    on any of them): a read begun now ends there. Not merely `last_seq`, which stays put when the newest facts are
    purged (retention trims ended batches by subject): a reader waiting to reach it would wait for ever."""
    if subjects:
        return max([await last_sequence(bus.js, subject) or 0 for subject in subjects])
    state = (await bus.js.stream_info(EVENTS_STREAM)).state
    if not state.messages:
        return 0
    if state.last_seq - state.first_seq + 1 == state.messages:
        return state.last_seq  # no gap anywhere: the last sequence is a fact
    with contextlib.suppress(nats.js.errors.NotFoundError):
        return (await bus.js.get_msg(EVENTS_STREAM, state.last_seq)).seq or state.last_seq
    return await last_sequence(bus.js, EVENTS_SUBJECTS) or 0


async def read(bus: EventBus, subject: str = EVENTS_SUBJECTS, after: int = 0,
               since: datetime | None = None) -> AsyncIterator[Fact]:
    """Every fact on `subject` with a sequence above `after` (or published at `since` or later), in stream order,
    up to the head as it was when reading began."""
    last = await head(bus)
    if since is not None:
        after = max(after, await _sequence_before(bus, subject, since))
    while after < last:
        facts, more = await page(bus, subject, after)
        for fact in facts:
            if fact.sequence > last:
                return
            yield fact
        if not facts or not more:
            return
        after = facts[-1].sequence


async def page(bus: EventBus, subject: str, after: int = 0, limit: int = PAGE,
               max_bytes: int = PAGE_BYTES) -> tuple[list[Fact], bool]:
    """Up to `limit` facts (about `max_bytes`) on `subject` after `after`, in stream order, and whether more follow
    (none: caught up). What `read` pages through, and what an executor's batch log reads (or the fact desk for it)."""
    messages, more = await read_page(bus.js, EVENTS_STREAM, subject, after, limit, max_bytes)
    return [Fact(message.seq, message.subject, message.data, message.headers) for message in messages], more


async def follow(bus: EventBus, subject: str | tuple[str, ...] = EVENTS_SUBJECTS, after: int = 0,
                 batch: int = 1000, idle: bool = False) -> AsyncGenerator[list[Fact], None]:
    """The facts on `subject` (or on any of several) after `after`, then each as it is published, in groups as they
    arrive; forever. With `idle`, a quiet second at the head yields an empty group too (a live stream's heartbeat).
    Its consumer is made at the first group; `following` makes it first."""
    async with following(bus, subject, after, batch, idle) as groups:
        async for group in groups:
            yield group


def following(bus: EventBus, subject: str | tuple[str, ...] = EVENTS_SUBJECTS, after: int = 0, batch: int = 1000,
              idle: bool = False) -> contextlib.AbstractAsyncContextManager[AsyncIterator[list[Fact]]]:
    """`follow`, its consumer made before the body runs (nothing published from now on is missed), released after."""
    return OrderedReader(bus, after, batch, subject).reading(idle, consumer_first=True)


def published_at(fact: Fact) -> datetime | None:
    """When the stream stored `fact` (known for facts from `read`)."""
    stamp = (fact.headers or {}).get(PUBLISHED_AT)
    return datetime.fromisoformat(stamp) if stamp else None


async def _sequence_before(bus: EventBus, subject: str, since: datetime) -> int:
    """The sequence just before the first fact on `subject` stored at `since` or later (the head: none is)."""
    request = orjson.dumps({"start_time": since.isoformat(), "next_by_subj": subject})
    reply = await bus.nc.request(direct_get(EVENTS_STREAM), request, timeout=START_TIMEOUT_S)
    headers = reply.headers or {}
    if "Nats-Sequence" not in headers:
        return await head(bus)  # 404: nothing stored since then
    return int(headers["Nats-Sequence"]) - 1
