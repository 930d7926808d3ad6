"""A fact desk for tests that send run commands themselves: the book it judges on is told what each command holds,
as the scheduler's would be when it assigned the attempt."""

import asyncio
import contextlib
from collections.abc import AsyncIterator

from contracts.commands import RunBatch
from contracts.events.batch import BatchAssigned, BatchCreated, BatchValidated
from contracts.subjects import EVENTS_STREAM, FACT_SUBMISSIONS, LOG_READS
from services.runtime.nats.bus import EventBus
from services.runtime.nats.kv import ensure_direct_reads
from services.runtime.storage.objectstore import ObjectStore
from services.scheduler.book import Book
from services.scheduler.desk import READS, SUBMISSIONS, FactDesk
from tests.integration.router_support import bare


@contextlib.asynccontextmanager
async def fact_desk(core: EventBus, admitted: set[str] | None = None,
                    store: ObjectStore | None = None) -> AsyncIterator[Book]:
    """The desk answering on `core` until the block ends; the book it judges on (caught up from the start)."""
    await ensure_direct_reads(core.js, EVENTS_STREAM)
    book = Book(admitted=admitted or set())
    caught_up = asyncio.Event()
    caught_up.set()
    desk = FactDesk(core, book, caught_up, store=store)
    subscriptions = [await core.nc.subscribe(FACT_SUBMISSIONS, cb=bare(SUBMISSIONS, desk.submit)),
                     await core.nc.subscribe(LOG_READS, cb=bare(READS, desk.read))]
    await core.nc.flush()
    try:
        yield book
    finally:
        for subscription in subscriptions:
            await subscription.unsubscribe()


def hold(book: Book, command: RunBatch) -> None:
    """What the book knows once the scheduler assigned `command`'s attempt."""
    batch_id = command.batch_id
    book.apply(BatchCreated(aggregate_id=batch_id, terms=command.terms.model_copy(update={"expires_at": 10**10}),
                            input_file_id="file-in", completion_window="24h"))
    book.apply(BatchValidated(aggregate_id=batch_id, total_lines=command.total_lines, model=command.model))
    book.apply(BatchAssigned(aggregate_id=batch_id, executor_id=command.executor_id, attempt=command.attempt,
                             lease_token=command.lease_token, shard=command.shard, shards=command.layout.shards,
                             shard_span=command.layout.span))
