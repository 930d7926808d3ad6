"""Reading a batch's event log: once (the finalizer) or followed live (the running attempt).

From EVENTS through an ephemeral pull consumer (it knows how many facts exist when it is made, so "caught up" is
exact), or, for an executor under NATS authorization, from the fact desk, page by page to the end.
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Protocol

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from pydantic import ValidationError

from contracts.events.registry import decode_event
from contracts.subjects import EVENTS_STREAM, batch_events
from services.executor.adapters.desk import DeskBus, FactDesk, Sequenced
from services.executor.attempts import BatchLog, StopReason
from services.runtime.bus import EventBus

log = logging.getLogger(__name__)

FETCH = 256
POLL_S = 0.5
"""How often a batch followed through the fact desk is read again while nothing new came."""



class EventReader:
    """One batch's facts in stream order, from the first, through an ephemeral consumer of its own (a broker that
    lets this connection read EVENTS)."""

    def __init__(self, bus: EventBus, name: str, subscription: JetStreamContext.PullSubscription) -> None:
        self.bus = bus
        self.name = name
        self.subscription = subscription
        self.received = 0

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
            try:
                events.append((message.metadata.sequence.stream, decode_event(message.data)))
            except ValidationError:
                # A fact of a newer kind than this executor knows says nothing about its attempts.
                log.debug("skipping an undecodable event on %s", message.subject)
        return events

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

    async def _page(self) -> tuple[list[Sequenced], bool]:
        facts, self.after, more = await self.desk.read(self.batch_id, self.after)
        return facts, more


class LogReader(Protocol):
    async def next_events(self, timeout_s: float = 1.0) -> list[Sequenced]: ...


async def read_batch_log(bus: EventBus, batch_id: str) -> BatchLog:
    """The batch's log as it stands now."""
    batch_log = BatchLog()
    async with EventReader.open(bus, batch_id) as (_, backlog):
        for sequence, event in backlog:
            batch_log.fold(event, sequence)
    return batch_log


class BatchWatch:
    """The running attempt's view of its batch: `stopping` is set on cancel, expiry, a lost lease or an end."""

    def __init__(self, attempt: int) -> None:
        self.attempt = attempt
        self.log = BatchLog()
        self.stopping = asyncio.Event()
        self.requested: StopReason | None = None
        self.seen_sequence = 0
        self.moved = asyncio.Event()
        """Set (and replaced) whenever new facts were folded."""
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, bus: EventBus, batch_id: str, attempt: int,
                   expires_at: int | None = None) -> AsyncIterator["BatchWatch"]:
        """`expires_at`: when the batch expires, from its run command (a log read through the fact desk does not
        show the batch's creation)."""
        watch = cls(attempt)
        watch.log.expires_at = expires_at
        async with EventReader.open(bus, batch_id) as (reader, backlog):
            watch.fold(backlog)
            following = asyncio.create_task(watch._follow(reader))
            try:
                yield watch
            finally:
                watch._closed = True
                following.cancel()
                # A fetch may swallow the cancellation (asyncio.wait_for in 3.11); the flag ends the loop.
                await asyncio.wait({following}, timeout=2.0)
                if watch._timer is not None:
                    watch._timer.cancel()

    @property
    def fenced(self) -> bool:
        """This attempt may commit nothing more: its lease is gone or the batch already ended."""
        return not self.log.is_current(self.attempt) or self.log.ended is not None

    def stop_reason(self) -> StopReason | None:
        return self.log.stop_reason(time.time()) or self.requested

    def request_stop(self, reason: StopReason) -> None:
        """A FinalizeBatch for this batch reached this executor: the running attempt ends it."""
        self.requested = self.requested or reason
        self._update()

    def fold(self, events: list[Sequenced]) -> None:
        for sequence, event in events:
            self.log.fold(event, sequence)
            self.seen_sequence = max(self.seen_sequence, sequence)
        self._update()
        self.moved.set()
        self.moved = asyncio.Event()

    async def caught_up_to(self, sequence: int, within_s: float = 10.0) -> bool:
        """Wait until the watch has folded the log up to `sequence`; False if it did not within `within_s`."""
        deadline = time.monotonic() + within_s
        while self.seen_sequence < sequence:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.moved.wait(), remaining)
        return True

    def _update(self) -> None:
        if self.fenced or self.stop_reason() is not None:
            self.stopping.set()
        elif self.log.expires_at is not None and self._timer is None:
            delay = max(0.0, self.log.expires_at - time.time())
            self._timer = asyncio.get_running_loop().call_later(delay, self._update)

    async def _follow(self, reader: LogReader) -> None:
        while not self._closed:
            try:
                self.fold(await reader.next_events())
            except (nats.errors.Error, OSError) as error:
                # The broker may be reconnecting; the pull consumer resumes where it was.
                log.warning("batch watch interrupted: %r", error)
                await asyncio.sleep(0.5)
