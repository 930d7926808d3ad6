"""Running one attempt at a batch (or at one shard, a unit, of it): skip committed lines, run the rest
concurrently, commit chunks, then finalize the batch (one shard) or report the shard finished (several).

While it runs it watches the batch's log: on cancel or expiry no new line starts and the batch is finalized
with the lines never run as errors. Every fact it publishes is conditional on the batch's last `attempt_failed`
being one it has seen (a JetStream fence): once its lease is revoked it cannot commit anything more, even if it
has not noticed yet (a pause, a partition).

A unit costs its own lines, not its batch's: the units of a batch running here share one read of the batch's log
(`WatchHub`) and one local copy of its input (`InputCache`), and a unit reads back only the chunks of its own
lines when it resumes.
"""

import asyncio
import logging
import weakref
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing

from contracts.api.batch import BatchUsage
from contracts.commands import RunBatch
from contracts.events.batch import BatchProgressed, BatchStarted, ShardFinished
from contracts.events.envelope import Event
from contracts.ids import output_file_id
from contracts.objects import AHEAD, WantedObject
from contracts.subjects import attempt_failures, input_object_key, result_chunk_key
from services.executor.adapters.brokered_store import BrokeredObjectStore
from services.executor.adapters.desk import publish_in_order
from services.executor.adapters.engines.base import Engine
from services.executor.adapters.input_cache import InputCache, InputCopy
from services.executor.adapters.objects import ObjectAccess
from services.executor.adapters.results import ResultStore
from services.executor.adapters.watch import BatchWatch, WatchHub
from services.executor.attempt_run import AttemptRun
from services.executor.attempts import BatchLog
from services.executor.chunk_lines import ResultLine
from services.executor.domain import Chunk, ChunkCommitter, InputLine, Resume, Tally, parse_input_line, usage_of
from services.executor.finalizer import Ender, Finalizer, Publish
from services.executor.retry import LineRetry
from services.executor.slots import SlotPool
from services.runtime.nats.bus import EventBus, Fence, FenceMoved

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


def attempt_key(command: RunBatch) -> AttemptKey:
    return command.batch_id, command.attempt, command.shard


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
        self.announced: dict[AttemptKey, set[str]] = {}
        """Chunk keys each running attempt announced (its watch may not have read them back yet)."""
        self.in_hand: dict[AttemptKey, list[tuple[str, Sequence[ResultLine]]]] = {}
        """The chunks of each running unsharded attempt's lines it read on resuming or committed itself: one that
        holds every announced chunk of its batch finalizes without reading them back."""
        self.running: dict[AttemptKey, BatchWatch] = {}
        """The attempts this executor runs now: a FinalizeBatch for a batch is handed to every one of its own."""
        self.pools: weakref.WeakKeyDictionary[Engine, SlotPool] = weakref.WeakKeyDictionary()
        """One pool of slots per loaded engine, shared by every attempt running on it."""
        self._ending: dict[AttemptKey, asyncio.Event] = {}

    def attempts_of(self, batch_id: str) -> list[BatchWatch]:
        """The watches of the attempts (or shards) of `batch_id` running here now."""
        return [watch for key, watch in self.running.items() if key[0] == batch_id]

    async def run(self, command: RunBatch, engine: Engine) -> None:
        key = attempt_key(command)
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
                    self.announced.pop(key, None)
                    self.in_hand.pop(key, None)
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
        publish = self._fenced_publisher(command, watch)
        # A delivery publishes `started` before it writes any chunk: with none in the log (read to its end when
        # the watch opened) no earlier delivery of this attempt wrote one, and resuming lists nothing.
        first_run = command.attempt not in watch.log.started
        unannounced: list[Event] = []  # the last chunk's progress: it goes out with the attempt's end
        if watch.stop_reason() is None:
            if not await publish(BatchStarted(
                aggregate_id=batch_id, executor_id=self.executor_id,
                attempt=command.attempt, engine=engine.name, engine_version=engine.version,
            )):
                return
            last = await self._run_lines(command, engine, watch, publish, first_run)
            if last is None:
                log.warning("batch %s attempt %d fenced off; its last results are dropped", batch_id,
                            command.attempt)
                return
            unannounced = last
        reason = watch.stop_reason()
        if command.sharded:
            # The scheduler finalizes once every shard finished (or, on cancel or expiry, once none runs).
            await publish(*unannounced, ShardFinished(aggregate_id=batch_id, attempt=command.attempt,
                                                      shard=command.shard, executor_id=self.executor_id,
                                                      stopped=reason is not None))
            return
        ender = Ender(watch.log, lambda: read_through_finalizing(watch, batch_id), publish, command.attempt,
                      self.announced.setdefault(attempt_key(command), set()), self.in_hand.get(attempt_key(command)))
        if await self.finalizer.finish(command, reason or "completed", ender, stating=unannounced):
            watch.feed.ended_here = True

    def _fenced_publisher(self, command: RunBatch, watch: BatchWatch) -> Publish:
        fence_subject = attempt_failures(command.batch_id)

        async def publish(*events: Event) -> bool:
            """Publish in order while this attempt holds its lease; False (nothing more written) once it does not."""
            while not watch.fenced:
                try:
                    await publish_in_order(self.bus, events, Fence(fence_subject, watch.log.fence_sequence))
                    announced = self.announced.setdefault(attempt_key(command), set())
                    announced.update(event.chunk_key for event in events if isinstance(event, BatchProgressed))
                    return True
                except FenceMoved as moved:
                    # Another attempt failed since (maybe this one): read the log that far, then judge.
                    if not await watch.feed.caught_up_to(moved.last_sequence):
                        raise
            return False

        return publish

    async def _run_lines(self, command: RunBatch, engine: Engine, watch: BatchWatch, publish: Publish,
                         first_run: bool = False) -> list[Event] | None:
        """Run every line of the attempt's shard no attempt committed (`AttemptRun`): the progress of its last
        chunk, written but not yet announced; None once the lease is lost."""
        resume = await self._resume(command, watch, first_run)
        tally = resume.tally(command.layout, command.shard)
        if resume.last_chunk is not None and not await publish(self._progressed(
                command, resume.last_chunk, tally.completed, tally.failed, resume.last_chunk_usage)):
            # An earlier delivery may have committed this chunk and stopped before announcing it.
            return None
        log.info("batch %s attempt %d (shard %d of %d): %d of its lines already committed",
                 command.batch_id, command.attempt, command.shard + 1, command.layout.shards, len(resume.committed))
        if isinstance(self.store, BrokeredObjectStore):
            await self.store.ask_ahead(command.batch_id, command.attempt, self._ahead(command, resume, tally))
        committer = ChunkCommitter(self.chunk_lines, resume.next_chunk, tally, self.chunk_max_wait_s)
        slots = self.pools.setdefault(engine, SlotPool(engine.slots))
        return await AttemptRun(self, command, engine, watch, publish, resume, committer, slots).run()

    def _ahead(self, command: RunBatch, resume: Resume, tally: Tally) -> list[WantedObject]:
        """The objects the attempt's run gets and puts: its input (unless a copy is here), a chunk for each
        `chunk_lines` of its unit's lines not committed, and the output file of an unsharded batch."""
        layout, shard = command.layout, command.shard
        first, last = layout.first_line(shard), layout.last_line(shard) or command.total_lines
        chunks = -(-max(last - first + 1 - tally.completed - tally.failed, 0) // self.chunk_lines)
        wanted = [] if command.batch_id in self.inputs.copies else [
            WantedObject(operation="get", key=command.terms.input_object_key)]
        if not command.sharded:
            wanted.append(WantedObject(operation="put", key=input_object_key(output_file_id(command.batch_id))))
        wanted.extend(WantedObject(operation="put", key=result_chunk_key(command.batch_id, command.attempt, number))
                      for number in range(resume.next_chunk, resume.next_chunk + min(chunks, AHEAD)))
        return wanted

    async def _resume(self, command: RunBatch, watch: BatchWatch, first_run: bool) -> Resume:
        """What is committed of the attempt's own lines: the chunks the log announced for its shard, those this
        attempt wrote (the last may be unannounced; none on its first run), and the lines of it that validation
        refused (none read when the command says there are none)."""
        layout, shard = command.layout, command.shard
        keys = watch.log.unit_chunks(shard, layout)
        if not first_run:
            keys.update(await self.results.attempt_chunk_keys(command.batch_id, command.attempt))
        chunks = list(await self.results.chunks(keys))
        chunks.extend(await self.results.refused(command.batch_id, lambda line: layout.shard_of(line) == shard,
                                                 command.rejections_object_key))
        if not command.sharded:  # a unit of a sharded batch never finalizes it: nothing to keep
            self.in_hand[attempt_key(command)] = list(chunks)
        return Resume.from_chunks(chunks, command.attempt)

    async def pending_lines(self, command: RunBatch, resume: Resume, copy: InputCopy,
                             stop: asyncio.Event) -> AsyncGenerator[InputLine, None]:
        """The shard's lines no attempt committed, read from the batch's local copy; none more once `stop` is set."""
        done = resume.committed  # by line: includes lines validation refused, which may not even parse
        first, last = command.layout.first_line(command.shard), command.layout.last_line(command.shard)
        async with aclosing(copy.lines(first, last, stop)) as lines:
            async for number, raw in lines:
                if number in done:
                    continue
                line = parse_input_line(number, raw)
                if line is not None:
                    yield line

    async def commit(self, command: RunBatch, chunk: Chunk) -> BatchProgressed | None:
        """Results are durable in the object store before a fact says they are; they count only once it does,
        and a fenced attempt's fact is refused. The fact that announces the chunk written; None once the lease is
        lost."""
        try:
            key = await self.results.put_chunk(command.batch_id, command.attempt, chunk)
        except PermissionError as refused:
            # A brokered store is refused the write once the attempt's lease is gone: the same fence, earlier.
            log.warning("batch %s attempt %d: chunk %d refused (%s); the lease is lost", command.batch_id,
                        command.attempt, chunk.number, refused)
            return None
        if not command.sharded:
            self.in_hand.setdefault(attempt_key(command), []).append((key, list(chunk.lines)))
        return self._progressed(command, chunk.number, chunk.completed, chunk.failed, usage_of(chunk.lines))

    @staticmethod
    def _progressed(command: RunBatch, chunk: int, completed: int, failed: int,
                    usage: BatchUsage | None) -> BatchProgressed:
        return BatchProgressed(aggregate_id=command.batch_id, attempt=command.attempt, chunk=chunk,
                               chunk_key=result_chunk_key(command.batch_id, command.attempt, chunk),
                               completed=completed, failed=failed, shard=command.shard, usage=usage)

