"""Reading a batch's event log in stream order: once (the finalizer) or followed live (the batch's feed).

From EVENTS through an ephemeral pull consumer (it knows how many facts exist when it is made, so "caught up" is
exact), or, for an executor under NATS authorization, from the fact desk, page by page to the end. A reader that
is followed live can be brought up to the log's end as it stands now (an attempt joining a feed already open).
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from pydantic import ValidationError

from contracts.events.registry import decode_event
from contracts.subjects import EVENTS_STREAM, batch_events
from services.executor.adapters.desk import DeskBus, FactDesk, Sequenced
from services.executor.attempts import BatchLog
from services.runtime.nats.bus import EventBus

log = logging.getLogger(__name__)

FETCH = 256
POLL_S = 0.5
"""How often a batch followed through the fact desk is read again while nothing new came."""
CATCH_UP_S = 10.0
"""How long bringing a followed reader up to the log's end may take before it fails."""

Fold = Callable[[list[Sequenced]], None]
Moved = Callable[[float], Awaitable[None]]
"""Waits (at most the given seconds) until the follower folded more of the log."""


class LogReader(Protocol):
    async def next_events(self, timeout_s: float = 1.0) -> list[Sequenced]:
        """The next facts in stream order (none within about `timeout_s`: an empty list)."""

    async def catch_up(self, fold: Fold, moved: Moved) -> None:
        """Return once every fact the log holds now is folded, by `fold` here or by the follower of
        `next_events` (whose progress `moved` waits for)."""


class EventReader:
    """One batch's facts in stream order, from the first, through an ephemeral consumer of its own (a broker that
    lets this connection read EVENTS)."""

    def __init__(self, bus: EventBus, name: str, subscription: JetStreamContext.PullSubscription) -> None:
        self.bus = bus
        self.name = name
        self.subscription = subscription
        self.received = 0
        self.last_sequence = 0
        """Stream sequence of the last message received, decoded or not."""

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, bus: EventBus, batch_id: str) -> AsyncIterator[tuple["LogReader", list[Sequenced]]]:
        """The reader and every fact the batch has so far, with its stream sequence."""
        if isinstance(bus, DeskBus):
            async with DeskReader.open(bus.desk, batch_id) as opened:
                yield opened
            return
        config = ConsumerConfig(filter_subject=batch_events(batch_id), deliver_policy=DeliverPolicy.ALL,
                                ack_policy=AckPolicy.NONE, inactive_threshold=60.0, mem_storage=True)
        info = await bus.js.add_consumer(EVENTS_STREAM, config)
        reader = cls(bus, info.name, await bus.js.pull_subscribe_bind(consumer=info.name, stream=EVENTS_STREAM))
        try:
            backlog: list[Sequenced] = []
            while reader.received < (info.num_pending or 0):
                backlog.extend(await reader.next_events(timeout_s=5.0))
            yield reader, backlog
        finally:
            await reader.close()

    async def next_events(self, timeout_s: float = 1.0) -> list[Sequenced]:
        try:
            messages = await self.subscription.fetch(FETCH, timeout=timeout_s)
        except TimeoutError:
            # nats.errors.TimeoutError is one, and an idle pull may also time out as asyncio's.
            return []
        self.received += len(messages)
        events = []
        for message in messages:
            sequence = message.metadata.sequence.stream
            self.last_sequence = max(self.last_sequence, sequence)
            try:
                events.append((sequence, decode_event(message.data)))
            except ValidationError:
                # A fact of a newer kind than this executor knows says nothing about its attempts.
                log.debug("skipping an undecodable event on %s", message.subject)
        return events

    async def catch_up(self, fold: Fold, moved: Moved) -> None:
        """The consumer says what it delivered and what waits: once nothing waits and the follower received the
        last delivered message, every fact that existed at the question is folded. Two fetches at once would
        split the log between them out of order, so the follower alone fetches."""
        deadline = time.monotonic() + CATCH_UP_S
        while True:
            info = await self.bus.js.consumer_info(EVENTS_STREAM, self.name)
            if not info.num_pending and self.last_sequence >= (info.delivered.stream_seq or 0):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the log of consumer {self.name} was not read to its end in {CATCH_UP_S:.0f}s")
            await moved(0.2)

    async def close(self) -> None:
        with contextlib.suppress(nats.errors.Error, nats.js.errors.Error):
            await self.subscription.unsubscribe()
            await self.bus.js.delete_consumer(EVENTS_STREAM, self.name)


class DeskReader:
    """One batch's execution facts in stream order, read from the fact desk (an executor under authorization may
    not read EVENTS): pages until caught up, then a page every `POLL_S` while followed. Holds nothing open."""

    def __init__(self, desk: FactDesk, batch_id: str) -> None:
        self.desk = desk
        self.batch_id = batch_id
        self.after = 0
        self.reading = asyncio.Lock()
        """One page at a time: a page and its fold happen before the next page is asked for."""

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, desk: FactDesk, batch_id: str) -> AsyncIterator[tuple["LogReader", list[Sequenced]]]:
        reader = cls(desk, batch_id)
        backlog: list[Sequenced] = []
        more = True
        while more:
            facts, more = await reader._page()
            backlog.extend(facts)
        yield reader, backlog

    async def next_events(self, timeout_s: float = 1.0) -> list[Sequenced]:
        facts, _ = await self._page()
        if not facts:
            await asyncio.sleep(min(timeout_s, POLL_S))
        return facts

    async def catch_up(self, fold: Fold, moved: Moved) -> None:
        """Pages to the end, each folded as it comes. The follower folds its page in the same step it gets it,
        before this one can ask for the next: the log is folded in order."""
        async with self.reading:
            more = True
            while more:
                facts, self.after, more = await self.desk.read(self.batch_id, self.after)
                fold(facts)

    async def _page(self) -> tuple[list[Sequenced], bool]:
        async with self.reading:
            facts, self.after, more = await self.desk.read(self.batch_id, self.after)
        return facts, more


async def read_batch_log(bus: EventBus, batch_id: str) -> BatchLog:
    """The batch's log as it stands now."""
    batch_log = BatchLog()
    async with EventReader.open(bus, batch_id) as (_, backlog):
        for sequence, event in backlog:
            batch_log.fold(event, sequence)
    return batch_log
