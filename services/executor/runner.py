"""Running one attempt at a batch (or at one shard, a unit, of it): skip committed lines, run the rest, commit chunks,
then finalize the batch or report the shard finished. Every fact is fenced on the batch's last `attempt_failed`, so a
revoked lease commits nothing more even before the attempt notices."""

import asyncio
import logging
import weakref

from contracts.commands import RunBatch
from contracts.events.batch import BatchStarted, ShardFinished
from contracts.events.envelope import Event
from services.executor.adapters.engines.base import Engine
from services.executor.adapters.input_cache import InputCache
from services.executor.adapters.objects import ObjectAccess
from services.executor.adapters.results import ResultStore
from services.executor.adapters.watch import BatchWatch, WatchHub
from services.executor.attempt_run import AttemptRun
from services.executor.attempts import BatchLog
from services.executor.finalizer import Ender, Finalizer
from services.executor.retry import LineRetry
from services.executor.slots import SlotPool
from services.runtime.nats.bus import EventBus

log = logging.getLogger(__name__)

FINALIZING_READ_S = 30.0
"""How long an attempt waits to read its own `finalizing` fact back (then it fails, and is delivered again)."""


async def read_through_finalizing(watch: BatchWatch, batch_id: str) -> BatchLog:
    """The batch's log read until it shows the `finalizing` fact just stated (and a cancel before it)."""
    if not await watch.feed.read_until(lambda batch_log: batch_log.finalizing, FINALIZING_READ_S):
        raise TimeoutError(f"batch {batch_id}: its finalizing fact was not read back in {FINALIZING_READ_S}s")
    return watch.log


AttemptKey = tuple[str, int, int]
"""(batch id, attempt, shard): one attempt this executor runs; several may run at once, even of one batch."""


class BatchRunner:
    """Every step is idempotent: a redelivered command redoes nothing committed and republishes the same ids."""

    def __init__(self, bus: EventBus, store: ObjectAccess, executor_id: str, chunk_lines: int,
                 retry: LineRetry | None = None, chunk_max_wait_s: float = float("inf")) -> None:
        self.bus = bus
        self.store = store
        self.results = ResultStore(store)
        self.inputs = InputCache(store)
        """The local copies of the inputs of the batches with units here."""
        self.watches = WatchHub(bus)
        """One feed of each batch's log, shared by its attempts here."""
        self.finalizer = Finalizer(bus, store, self.results)
        self.executor_id = executor_id
        self.chunk_lines = chunk_lines
        self.chunk_max_wait_s = chunk_max_wait_s
        self.retry = retry or LineRetry()
        self.running: dict[AttemptKey, BatchWatch] = {}
        """The attempts this executor runs now: a FinalizeBatch for a batch is handed to every one of its own."""
        self.pools: weakref.WeakKeyDictionary[Engine, SlotPool] = weakref.WeakKeyDictionary()
        """One pool of slots per loaded engine, shared by every attempt running on it."""
        self._ending: dict[AttemptKey, asyncio.Event] = {}

    def attempts_of(self, batch_id: str) -> list[BatchWatch]:
        return [watch for key, watch in self.running.items() if key[0] == batch_id]

    async def run(self, command: RunBatch, engine: Engine) -> None:
        key = (command.batch_id, command.attempt, command.shard)
        while (running := self._ending.get(key)) is not None:
            await running.wait()  # a second delivery of an attempt in hand runs after it (and redoes nothing)
        ended = self._ending[key] = asyncio.Event()
        try:
            async with self.watches.watch(command.batch_id, command.attempt, command.terms.expires_at) as watch:
                self.running[key] = watch
                try:
                    await self._attempt(command, engine, watch)
                finally:
                    del self.running[key]
                    batch_ended = watch.log.ended is not None or watch.feed.ended_here
                    if batch_ended and not self.attempts_of(command.batch_id):
                        self.forget(command.batch_id)
        finally:
            del self._ending[key]
            ended.set()

    def forget(self, batch_id: str) -> None:
        """Drop what this executor keeps of a batch that ended (its input's copy, its refused lines)."""
        self.inputs.forget(batch_id)
        self.results.forget(batch_id)

    async def close(self) -> None:
        await self.watches.close()
        self.inputs.close()

    async def _attempt(self, command: RunBatch, engine: Engine, watch: BatchWatch) -> None:
        batch_id = command.batch_id
        if watch.fenced:
            log.warning("batch %s attempt %d is no longer current; nothing to do", batch_id, command.attempt)
            return
        attempt = AttemptRun(self, command, engine, watch, BatchStarted(
            aggregate_id=batch_id, executor_id=self.executor_id, attempt=command.attempt, engine=engine.name,
            engine_version=engine.version))
        # A delivery publishes `started` before it writes any chunk: with none in the log (read to its end when
        # the watch opened) no earlier delivery of this attempt wrote one, and resuming lists nothing.
        first_run = command.attempt not in watch.log.started
        unannounced: list[Event] = []  # the last chunk's progress: it goes out with the attempt's end
        if watch.stop_reason() is None:
            last = await attempt.run(first_run)
            if last is None:
                log.warning("batch %s attempt %d fenced off; its last results are dropped", batch_id, command.attempt)
                return
            unannounced = last
        reason = watch.stop_reason()
        if command.sharded:
            # The scheduler finalizes once every shard finished (or, on cancel or expiry, once none runs).
            await attempt.publish(*unannounced, ShardFinished(aggregate_id=batch_id, attempt=command.attempt,
                                                              shard=command.shard, executor_id=self.executor_id,
                                                              stopped=reason is not None))
            return
        ender = Ender(watch.log, lambda: read_through_finalizing(watch, batch_id), attempt.publish, command.attempt,
                      attempt.announced, attempt.in_hand)
        if await self.finalizer.finish(command, reason or "completed", ender, stating=unannounced):
            watch.feed.ended_here = True
