"""Stream messages → the ledger in groups, off the event loop → projections into a sink → checkpoint → a notice of
how far (`announce_folds`); and the ledger's table (`ledger_router`): the fold of the log it runs."""

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TypeVar

from nats.errors import MaxPayloadError

from contracts.subjects import LEDGER_FOLDED, LEDGER_NAME
from services.ledger.application import Ledger
from services.ledger.chain import Fact
from services.ledger.observe import record_fold
from services.ledger.projection import Projection, folded_records, in_write_order, projection_key, stored
from services.ledger.rules import folded_types
from services.runtime.nats.bus import EventBus
from services.runtime.nats.delivery import LogFollower, ServiceRouter
from services.runtime.nats.readmodel import ReadModel
from services.runtime.storage.write_failures import write_fault

log = logging.getLogger(__name__)

Sink = Callable[[list[Projection]], Awaitable[None]]
R = TypeVar("R")
RETRY_DELAYS_S = (0.2, 0.5, 1.0, 2.0, 5.0)
IDLE_POLL_S = 0.25
BUSY_WINDOW_S = 1.0
"""The recent span over which `busy_facts_per_s` is measured."""
MATERIALISE_BEHIND = 4
"""Groups folded and not yet in the sink at most: then the fold waits for the sink."""


class Folder:
    """Takes facts from the ordered reader and folds them in groups, in stream order."""

    def __init__(self, ledger: Ledger, sink: Sink, start_after: int, group_size: int = 1000,
                 pace_s: float = 0.0, busy_facts_per_s: float = 250.0, gather_s: float = 0.0) -> None:
        self.ledger = ledger
        self.sink = sink
        self.group_size = group_size
        self.pace_s = pace_s
        """While busy, a group starts at least this long after the previous one (`LedgerSettings.fold_pace_s`)."""
        self.busy_facts_per_s = busy_facts_per_s
        self.gather_s = gather_s
        """A live group waits this long for more facts when none is queued (`LedgerSettings.fold_gather_s`)."""
        self._last_group_at = 0.0
        self._recent: deque[tuple[float, int]] = deque()
        """(when, how many facts) of the groups started in the last second."""
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
        self._unmaterialised: dict[str, Projection] = {}
        """Records folded and not in the sink yet, by read-model key: the next folds go on while they are put."""
        self._unmaterialised_facts: list[Fact] = []
        """The facts those records fold (checkpointed once the records are in the sink)."""
        self._unmaterialised_since_ns = 0
        self._materialiser: asyncio.Task[None] | None = None

    async def receive(self, facts: list[Fact]) -> None:
        """Queues facts, so the reader pulls the next ones while a group folds; waits while the queue is full."""
        if facts:
            await self._queue.put(facts)

    async def run(self, stop: asyncio.Event) -> None:
        """Fold queued facts until `stop` is set; the group in hand is always finished first (materialised too)."""
        try:
            while not stop.is_set():
                if not self._held:
                    try:
                        self._held = await asyncio.wait_for(self._queue.get(), timeout=IDLE_POLL_S)
                    except TimeoutError:
                        continue
                await self._paced()
                while len(self._held) < self.group_size and not self._queue.empty():
                    self._held = self._held + self._queue.get_nowait()
                group, self._held = self._held[:self.group_size], self._held[self.group_size:]
                self._recent.append((self._last_group_at, len(group)))
                await self._fold(group, stop)
        finally:
            await self._materialised()

    async def _paced(self) -> None:
        """While live, let more facts join the group: `gather_s` when no other delivery is queued yet, and while busy
        what is left of `pace_s` since the previous group started. A backlog folds as fast as it can."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        while self._recent and self._recent[0][0] < now - BUSY_WINDOW_S:
            self._recent.popleft()
        busy = sum(count for _, count in self._recent) >= self.busy_facts_per_s * BUSY_WINDOW_S
        if self.head_seen - self.folded_through <= self.group_size:
            wait = max(self._last_group_at + self.pace_s - now if busy else 0.0,
                       self.gather_s if self._queue.empty() else 0.0)
            if wait > 0:
                await asyncio.sleep(wait)
        self._last_group_at = loop.time()

    async def wait_through(self, sequence: int) -> None:
        async with self._advanced:
            await self._advanced.wait_for(lambda: self.folded_through >= sequence)

    async def _fold(self, group: list[Fact], stop: asyncio.Event) -> None:
        """Fold a group and hand its records on; they go into the sink while the next groups fold."""
        facts = group if group and group[0].sequence > self.folded_through else [
            fact for fact in group if fact.sequence > self.folded_through]
        if not facts:
            return
        started_ns = time.time_ns()
        projections = await self._retried("folding", facts, stop,
                                          lambda: asyncio.to_thread(folded_records, self.ledger, facts))
        if projections is None:
            return
        if not self._unmaterialised_facts:
            self._unmaterialised_since_ns = started_ns
        self._unmaterialised_facts += facts
        for projection in projections:  # a record folded again before it went out: only its last state goes
            self._unmaterialised[projection_key(projection)] = projection
        if self._materialiser is None or self._materialiser.done():
            self._materialiser = asyncio.create_task(self._materialise(stop))
        if len(self._unmaterialised_facts) >= MATERIALISE_BEHIND * self.group_size:
            await self._materialised()  # a slow or failing sink holds the fold back, not memory

    async def _materialise(self, stop: asyncio.Event) -> None:
        """Put what was folded into the sink, then checkpoint it; again while more was folded meanwhile."""
        while self._unmaterialised_facts:
            facts, self._unmaterialised_facts = self._unmaterialised_facts, []
            records, self._unmaterialised = list(self._unmaterialised.values()), {}
            since_ns = self._unmaterialised_since_ns
            last = facts[-1].sequence

            async def put_then_checkpoint(records: list[Projection] = records, last: int = last) -> bool:
                await self.sink(records)
                await asyncio.to_thread(self.ledger.record_checkpoint, last)
                return True

            if await self._retried("materialising", facts, stop, put_then_checkpoint) is None:
                return  # stopping: the next start folds these facts again from the checkpoint
            self.head_seen = max(self.head_seen, last)
            record_fold(facts, since_ns, time.time_ns(), self.head_seen)
            async with self._advanced:
                self.folded_through = last
                self.folded += len(facts)
                self._advanced.notify_all()

    async def _materialised(self) -> None:
        """Wait until everything folded so far is in the sink and checkpointed (or the sink gave up, stopping)."""
        if self._materialiser is not None:
            await self._materialiser

    @staticmethod
    async def _retried(doing: str, facts: list[Fact], stop: asyncio.Event,
                       step: Callable[[], Awaitable[R]]) -> R | None:
        """`step`, until it succeeds (folding and materialising are idempotent: a fact is never skipped for a failure
        of ours); None when `stop` is set after a failure (the group is done again next start)."""
        attempt = 0
        while True:
            try:
                return await step()
            except Exception as error:
                fault = write_fault(error)
                if fault is None:
                    log.exception("%s sequences %d..%d failed (attempt %d)", doing, facts[0].sequence,
                                  facts[-1].sequence, attempt + 1)
                else:  # a full disk or a broker restarting: said in a line, waited out
                    log.warning("%s sequences %d..%d waits (%s, attempt %d): %r", doing, facts[0].sequence,
                                facts[-1].sequence, fault, attempt + 1, error)
                if stop.is_set():
                    return None
                await asyncio.sleep(RETRY_DELAYS_S[min(attempt, len(RETRY_DELAYS_S) - 1)])
                attempt += 1


async def announce_folds(bus: EventBus, folder: Folder) -> None:
    """Say on `LEDGER_FOLDED` how far the read model holds the log, once per group put into it (or per several),
    until cancelled. A notice the connection cannot send is skipped: gateways waiting for it poll instead."""
    said = folder.folded_through
    while True:
        await folder.wait_through(said + 1)
        said = folder.folded_through
        try:
            await bus.nc.publish(LEDGER_FOLDED, str(said).encode())
        except Exception as error:  # a notice is a hint: the announcing goes on whatever one send met
            log.debug("fold notice through %d not sent: %s", said, error)


def read_model_sink(read_model: ReadModel) -> Sink:
    async def put(projection: Projection) -> None:
        key = projection_key(projection)
        try:
            await read_model.put(key, stored(projection))
        except MaxPayloadError:
            # Never taken, however often tried: retrying would hold every later fact of every tenant back. The
            # record stays as it was last written (the facts are all in the log; a replay shows them).
            log.error("the read model's record %s is larger than the broker takes: left as last written (an anomaly)",
                      key)

    async def sink(projections: list[Projection]) -> None:
        for records in in_write_order(projections):
            await asyncio.gather(*(put(each) for each in records))

    return sink


FOLD = ("Fold every fact, in stream order from the ledger's checkpoint, into its event-sourced aggregates (batches, "
        "files, keys, users, organisations, providers, executors) and materialise the records the gateway reads.")


async def into_folder(folder: Folder, facts: list[Fact], head_seen: int) -> None:
    folder.head_seen = max(folder.head_seen, head_seen)
    await folder.receive(facts)


async def after_checkpoint(folder: Folder) -> int:
    return folder.folded_through


LEDGER_FOLD = LogFollower(LEDGER_NAME, folded_types(), FOLD, take=into_folder, start_after=after_checkpoint,
                          every_fact=True, group_size=5000)
"""Every fact (the hash chain covers them all), from the folder's checkpoint, while the ledger folds."""


def ledger_router() -> ServiceRouter:
    """The ledger's table: the fold of the log it runs (fresh each call: a faststream router has one broker only)."""
    router = ServiceRouter(LEDGER_NAME, dependencies=LEDGER_NAME)
    router.follows(LEDGER_FOLD)
    return router
