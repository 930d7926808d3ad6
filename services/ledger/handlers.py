"""Stream messages → the ledger in groups, off the event loop → projections into a sink → checkpoint; and the
ledger's table (`ledger_router`): the fold of the log it runs."""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from contracts.readmodel import BatchRecord, FileRecord, UserRecord
from contracts.subjects import LEDGER_NAME
from services.ledger.application import Ledger
from services.ledger.chain import Fact
from services.ledger.observe import record_fold
from services.ledger.projection import KeyProjection, Projection, new_anomalies, project, projection_key
from services.ledger.rules import folded_types
from services.runtime.bus import EventBus
from services.runtime.delivery import LogFollower, ServiceRouter
from services.runtime.follower import OrderedReader
from services.runtime.readmodel import ReadModel

log = logging.getLogger(__name__)

Sink = Callable[[list[Projection]], Awaitable[None]]
RETRY_DELAYS_S = (0.2, 0.5, 1.0, 2.0, 5.0)
IDLE_POLL_S = 0.25


class Folder:
    """Takes facts from the ordered reader and folds them in groups, in stream order."""

    def __init__(self, ledger: Ledger, sink: Sink, start_after: int, group_size: int = 1000) -> None:
        self.ledger = ledger
        self.sink = sink
        self.group_size = group_size
        self.folded_through = start_after
        """Every fact up to this stream sequence is folded, materialised and checkpointed."""
        self.folded = 0
        """Facts folded since this process started."""
        self.head_seen = start_after
        """The stream's last sequence as the reader last saw it (fold lag = this minus folded_through)."""
        self._queue: asyncio.Queue[list[Fact]] = asyncio.Queue(maxsize=4)
        """Facts as the reader handed them on: a list per delivery, not a queue operation per fact."""
        self._held: list[Fact] = []
        """Facts taken from the queue and not folded yet (a delivery larger than a group)."""
        self._advanced = asyncio.Condition()

    async def receive(self, facts: list[Fact]) -> None:
        """Queues facts, so the reader pulls the next ones while a group folds; waits while the queue is full."""
        if facts:
            await self._queue.put(facts)

    async def run(self, stop: asyncio.Event) -> None:
        """Fold queued facts until `stop` is set; the group in hand is always finished first."""
        while not stop.is_set():
            if not self._held:
                try:
                    self._held = await asyncio.wait_for(self._queue.get(), timeout=IDLE_POLL_S)
                except TimeoutError:
                    continue
            while len(self._held) < self.group_size and not self._queue.empty():
                self._held = self._held + self._queue.get_nowait()
            group, self._held = self._held[:self.group_size], self._held[self.group_size:]
            await self._fold_with_retries(group, stop)

    async def wait_through(self, sequence: int) -> None:
        async with self._advanced:
            await self._advanced.wait_for(lambda: self.folded_through >= sequence)

    async def _fold_with_retries(self, group: list[Fact], stop: asyncio.Event) -> None:
        # A fact is never skipped for a failure of ours: retrying is safe, since folding is idempotent.
        attempt = 0
        while True:
            try:
                await self._fold(group)
                return
            except Exception:
                log.exception("folding sequences %d..%d failed (attempt %d)", group[0].sequence, group[-1].sequence,
                              attempt + 1)
                if stop.is_set():
                    return
                await asyncio.sleep(RETRY_DELAYS_S[min(attempt, len(RETRY_DELAYS_S) - 1)])
                attempt += 1

    async def _fold(self, group: list[Fact]) -> None:
        facts = [fact for fact in group if fact.sequence > self.folded_through]
        if not facts:
            return
        started_ns = time.time_ns()
        projections = await asyncio.to_thread(self._fold_sync, facts)
        await self.sink(projections)
        last = facts[-1].sequence
        await asyncio.to_thread(self.ledger.record_checkpoint, last)
        self.head_seen = max(self.head_seen, last)
        record_fold(facts, started_ns, time.time_ns(), self.head_seen)
        async with self._advanced:
            self.folded_through = last
            self.folded += len(facts)
            self._advanced.notify_all()

    def _fold_sync(self, facts: list[Fact]) -> list[Projection]:
        touched = self.ledger.fold_facts(facts)
        projections = [p for p in (project(a, self.ledger.user_of_key) for a in touched) if p is not None]
        return [*projections, *new_anomalies(touched, facts)]


async def follow(bus: EventBus, folder: Folder, stop: asyncio.Event) -> None:
    """Feed the folder every fact after its checkpoint, in stream order, until `stop` is set."""
    reader = OrderedReader(bus, folder.folded_through, folder.group_size)

    async def receive(facts: list[Fact]) -> None:
        folder.head_seen = max(folder.head_seen, reader.head_seen)
        await folder.receive(facts)

    await reader.run(receive, stop)


async def stop_reading(reader: "asyncio.Task[None]") -> None:
    """End a `follow` task: it may be waiting on a full queue nobody drains any more, so it is cancelled."""
    reader.cancel()
    await asyncio.gather(reader, return_exceptions=True)


def read_model_sink(read_model: ReadModel) -> Sink:
    async def put(projection: Projection) -> None:
        if isinstance(projection, BatchRecord):
            await read_model.put_batch(projection)
        elif isinstance(projection, FileRecord):
            await read_model.put_file(projection)
        elif isinstance(projection, UserRecord):
            await read_model.put_user(projection)
        elif isinstance(projection, KeyProjection):
            await read_model.put_api_key(projection.key_sha256, projection.record)
        else:
            await read_model.put(projection_key(projection), projection)

    async def sink(projections: list[Projection]) -> None:
        await asyncio.gather(*(put(projection) for projection in projections))

    return sink


FOLD = ("Fold every fact, in stream order from the ledger's checkpoint, into its event-sourced aggregates (batches, "
        "files, keys, users, organisations, providers, executors) and materialise the records the gateway reads.")


def ledger_router() -> ServiceRouter:
    """The ledger's table: the fold of the log it runs (on the ordered reader, `follow`), and nothing it emits.
    (A fresh router each call: faststream lets a router belong to one broker only.)"""
    router = ServiceRouter(LEDGER_NAME, dependencies=LEDGER_NAME)
    router.follows(LogFollower(LEDGER_NAME, folded_types(), FOLD))
    return router
