"""Reading a batch's event log in stream order, page by page, once (the finalizer) or followed (watch.py): from EVENTS
by direct gets, or through the fact desk for an executor under NATS authorization. A read holds no consumer open."""

from collections.abc import AsyncIterator, Awaitable, Callable

from contracts.subjects import batch_events
from services.executor.adapters.desk import DeskBus, Sequenced, decoded_facts
from services.executor.attempts import BatchLog
from services.runtime.nats import eventlog
from services.runtime.nats.bus import EventBus

PAGE_FACTS = 256
PAGE_BYTES = 4 << 20

Page = tuple[list[Sequenced], int, bool]
"""(the batch's facts after a sequence, the last sequence read, whether more follow)."""
Pages = Callable[[str, int], Awaitable[Page]]
"""(batch id, after sequence) → the page after it."""


def pages_of(bus: EventBus) -> Pages:
    """Where `bus` reads a batch's log from: the fact desk under authorization, else EVENTS directly."""
    if isinstance(bus, DeskBus):
        return bus.desk.read

    async def direct(batch_id: str, after: int) -> Page:
        page, more = await eventlog.page(bus, batch_events(batch_id), after, PAGE_FACTS, PAGE_BYTES)
        facts = decoded_facts((fact.sequence, fact.data) for fact in page)
        return facts, (page[-1].sequence if page else after), more

    return direct


async def pages_to_end(pages: Pages, batch_id: str, after: int = 0) -> AsyncIterator[Page]:
    """The batch's pages after sequence `after`, to the one that says no more follow."""
    more = True
    while more:
        facts, after, more = await pages(batch_id, after)
        yield facts, after, more


async def read_log(bus: EventBus, batch_id: str) -> list[Sequenced]:
    """Every fact the batch has so far, with its stream sequence."""
    return [fact async for facts, _, _ in pages_to_end(pages_of(bus), batch_id) for fact in facts]


async def read_batch_log(bus: EventBus, batch_id: str) -> BatchLog:
    """The batch's log as it stands now."""
    batch_log = BatchLog()
    for sequence, event in await read_log(bus, batch_id):
        batch_log.fold(event, sequence)
    return batch_log
