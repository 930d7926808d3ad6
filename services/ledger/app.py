"""The ledger's composition root: settings → broker, event store, read model → the folder that joins them."""

import asyncio
import logging

from contracts.subjects import LEDGER_LEADER_KEY, LEDGER_NAME
from services.ledger.application import Ledger
from services.ledger.archive import Archive
from services.ledger.handlers import Folder, Sink, announce_folds, ledger_router, read_model_sink
from services.ledger.projection import Projection
from services.ledger.reindex import index_holders, index_members_and_overdrawn, index_owners, index_read_model
from services.ledger.restore import archived_through, restore
from services.ledger.retention import Policy, Retention
from services.ledger.settings import LedgerSettings
from services.runtime.nats import eventlog
from services.runtime.nats.bus import EventBus
from services.runtime.nats.delivery import ServiceRouter
from services.runtime.nats.leader import LeaderLease
from services.runtime.nats.readmodel import ReadModel
from services.runtime.process import metrics
from services.runtime.process.tasks import cancel_and_join
from services.runtime.storage.objectstore import ObjectStore

log = logging.getLogger(__name__)


class LeaseLost(RuntimeError):
    """A standby took over while this ledger could not renew its lease: it stops (and stands by when restarted)."""


def fenced(sink: Sink, lease: LeaderLease | None) -> Sink:
    """`sink`, writing only while this ledger is sure it holds its lease: one paused past it (GC, SIGSTOP, a frozen
    VM) may have been replaced by a standby, and its records, folded from an older point of the log, would put
    records back as they were. Refused, the group is tried again (the fold's retries) until the keeper renews the
    lease or finds it lost, which stops the fold."""
    if lease is None:
        return sink

    async def write(projections: list[Projection]) -> None:
        if lease.lost():
            raise LeaseLost(f"ledger {lease.holder} may have lost its lease: its records wait for it to be renewed")
        await sink(projections)

    return write


class LedgerApp:
    """One running ledger. `caught_up` is set once every fact present at start is folded."""

    def __init__(self, settings: LedgerSettings) -> None:
        self.settings = settings
        self.caught_up = asyncio.Event()
        self.folder: Folder | None = None
        self._store: ObjectStore | None = None

    async def run(self, stop: asyncio.Event) -> None:
        bus = await EventBus.connect(self.settings.connection.nats_url, LEDGER_NAME)
        broker = bus.broker
        router = ledger_router()
        broker.include_router(router)
        lease, keeper = None, None
        try:
            folding = stop
            if self.settings.standby:
                lease = await LeaderLease.open(bus, self.settings.leader_ttl_s, LEDGER_LEADER_KEY)
                if not await lease.acquire(stop):
                    return
                # Fold until stopped or until the lease cannot be renewed (keep returns: a standby took over).
                folding = asyncio.Event()
                keeper = asyncio.create_task(lease.keep(stop))
                keeper.add_done_callback(lambda _: folding.set())
            ledger = await asyncio.to_thread(Ledger, self.settings.store_env())
            try:
                await broker.start()  # its table declares the fold, which the router runs in `_fold`
                await self._fold(router, bus, ledger, folding, lease)
            finally:
                await asyncio.to_thread(ledger.close)
            if lease is not None and not stop.is_set():
                raise LeaseLost(f"ledger {lease.holder} lost its lease; another ledger folds")
        finally:
            if keeper is not None:
                await cancel_and_join([keeper])
            if lease is not None:
                await lease.release()
            await broker.close_within()
            if self._store is not None:
                self._store.close()

    def _archive(self) -> Archive:
        if self._store is None:
            self._store = ObjectStore.from_settings(self.settings.connection)
        return Archive(self._store)

    async def _restore(self, read_model: ReadModel, ledger: Ledger, sink: Sink, checkpoint: int) -> int:
        """Where to read the stream after: the archived point (restored first) if the stream was trimmed past here."""
        marker = await archived_through(read_model)
        if marker is None or checkpoint >= marker.last_sequence:
            return checkpoint
        archive = self._archive()
        point = await archive.point(marker.index)
        await restore(ledger, archive, point, sink, checkpoint, self.settings.group_size)
        return point.last_sequence

    async def _fold(self, router: ServiceRouter, bus: EventBus, ledger: Ledger, stop: asyncio.Event,
                    lease: LeaderLease | None = None) -> None:
        read_model = await ReadModel.open(bus)
        checkpoint = await asyncio.to_thread(ledger.checkpoint)
        sink = fenced(read_model_sink(read_model), lease)
        checkpoint = await self._restore(read_model, ledger, sink, checkpoint)
        await index_owners(bus, ledger, sink, checkpoint)
        await index_read_model(ledger, read_model, checkpoint)
        await index_holders(ledger, read_model, sink)
        await index_members_and_overdrawn(ledger, read_model)
        folder = self.folder = Folder(ledger, sink, checkpoint, self.settings.group_size, self.settings.fold_pace_s,
                                      self.settings.fold_busy_facts_per_s, self.settings.fold_gather_s)
        head = await eventlog.head(bus)
        log.info("ledger resumes after sequence %d; stream head is %d", checkpoint, head)
        retention = Retention(bus, read_model, self._archive(), ledger, Policy(
            self.settings.retention_window_s, self.settings.segment_period_s)) if self.settings.retention else None
        # Nothing that can fail between these tasks' start and the `try` that ends them.
        worker = asyncio.create_task(folder.run(stop))
        helpers = [asyncio.create_task(self._announce_caught_up(folder, head)),
                   asyncio.create_task(announce_folds(bus, folder))]
        if retention is not None:
            helpers.append(asyncio.create_task(self._retain(retention, stop)))
        try:
            async with router.folding(bus, folder) as folds:  # the reader (cancelled at the end, on every path)
                stopped = asyncio.create_task(stop.wait())
                try:
                    await asyncio.wait([stopped, *folds.tasks], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    stopped.cancel()
                if not stop.is_set():  # the fold ended (it only ends failing): stop folding, then fail
                    stop.set()
                    raise folds.failure() or RuntimeError("the ledger's fold ended")
        finally:
            await cancel_and_join(helpers)
            await worker

    async def _retain(self, retention: Retention, stop: asyncio.Event) -> None:
        """Retention rounds, from when the fold has caught up with the stream as it was at start."""
        await self.caught_up.wait()  # (stopping cancels this task)
        await retention.run(stop)

    async def _announce_caught_up(self, folder: Folder, head: int) -> None:
        await folder.wait_through(head)
        log.info("ledger caught up with sequence %d (%d facts folded)", head, folder.folded)
        self.caught_up.set()


def create_app(settings: LedgerSettings) -> LedgerApp:
    metrics.register("ledger")
    return LedgerApp(settings)


async def run_ledger(settings: LedgerSettings, stop: asyncio.Event) -> None:
    await create_app(settings).run(stop)
