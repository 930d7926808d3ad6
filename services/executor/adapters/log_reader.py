"""Reading a batch's event log in stream order, page by page: once (the finalizer) or followed live (the batch's feed).

One reader over two sources of pages: EVENTS itself, by batched direct gets, for a connection that may read the
stream; or the fact desk, for an executor under NATS authorization, which may not. "Caught up" has one rule: a page
that says no more follow. Followed, the reader asks again every `POLL_S` while nothing new comes. It holds nothing
open: no consumer to release, on any path.
"""

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from contracts.subjects import batch_events
from services.executor.adapters.desk import DeskBus, Sequenced, decoded_facts
from services.executor.attempts import BatchLog
from services.runtime.nats import eventlog
from services.runtime.nats.bus import EventBus

PAGE_FACTS = 256
PAGE_BYTES = 4 << 20
POLL_S = 0.5
"""How often a followed batch's log is read again while nothing new came."""

Fold = Callable[[list[Sequenced]], None]
Pages = Callable[[str, int], Awaitable[tuple[list[Sequenced], int, bool]]]
"""(batch id, after sequence) → (the batch's facts after it, the last sequence read, whether more follow)."""


def pages_of(bus: EventBus) -> Pages:
    """Where `bus` reads a batch's log from: the fact desk under authorization, else EVENTS directly."""
    if isinstance(bus, DeskBus):
        return bus.desk.read

    async def direct(batch_id: str, after: int) -> tuple[list[Sequenced], int, bool]:
        page, more = await eventlog.page(bus, batch_events(batch_id), after, PAGE_FACTS, PAGE_BYTES)
        facts = decoded_facts((fact.sequence, fact.data) for fact in page)
        return facts, (page[-1].sequence if page else after), more

    return direct


class BatchLogReader:
    """One batch's facts in stream order, page by page from `pages`: to the end when opened, then a page at a time
    while followed."""

    def __init__(self, pages: Pages, batch_id: str) -> None:
        self.pages = pages
        self.batch_id = batch_id
        self.after = 0
        self.at_end = False
        """The last page said no more follow: the next is asked for only after a pause."""
        self.reading = asyncio.Lock()
        """One page at a time: a page and its fold happen before the next page is asked for."""

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, bus: EventBus, batch_id: str) -> AsyncIterator[tuple["BatchLogReader", list[Sequenced]]]:
        """The reader and every fact the batch has so far, with its stream sequence."""
        reader = cls(pages_of(bus), batch_id)
        backlog: list[Sequenced] = []
        await reader.catch_up(backlog.extend)
        yield reader, backlog

    async def next_events(self) -> list[Sequenced]:
        """The next facts in stream order, after a pause of `POLL_S` when the log was read to its end (an empty
        list: none came)."""
        if self.at_end:
            await asyncio.sleep(POLL_S)
        async with self.reading:
            facts, self.after, more = await self.pages(self.batch_id, self.after)
            self.at_end = not more
        return facts

    async def catch_up(self, fold: Fold) -> None:
        """Pages to the end, each folded as it comes. The follower folds its page in the same step it gets it,
        before this one can ask for the next: the log is folded in order."""
        async with self.reading:
            more = True
            while more:
                facts, self.after, more = await self.pages(self.batch_id, self.after)
                self.at_end = not more
                fold(facts)


async def read_batch_log(bus: EventBus, batch_id: str) -> BatchLog:
    """The batch's log as it stands now."""
    batch_log = BatchLog()
    async with BatchLogReader.open(bus, batch_id) as (_, backlog):
        for sequence, event in backlog:
            batch_log.fold(event, sequence)
    return batch_log
