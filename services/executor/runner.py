"""Running one batch attempt: skip committed lines, run the rest concurrently, commit chunks, finalize.

While it runs it watches the batch's log: on cancel or expiry no new line starts and the batch is finalized
with the lines never run as errors; once its lease is lost (AttemptFailed) it commits nothing more.
"""

import asyncio
import logging
import time
from collections.abc import AsyncIterator

from contracts.commands import RunBatch
from contracts.events.batch import BatchFinalizing, BatchProgressed, BatchStarted
from contracts.subjects import result_chunk_key
from services.executor.adapters.engines.base import Engine
from services.executor.adapters.results import ResultStore
from services.executor.adapters.watch import BatchWatch
from services.executor.domain import Chunk, ChunkCommitter, InputLine, Resume, parse_input_line, result_line
from services.executor.finalizer import Finalizer
from services.executor.observe import traced_line
from services.executor.retry import LineRetry
from services.runtime.bus import EventBus
from services.runtime.objectstore import ObjectStore

log = logging.getLogger(__name__)


class BatchRunner:
    """Every step is idempotent: a redelivered command redoes nothing committed and republishes the same ids."""

    def __init__(self, bus: EventBus, store: ObjectStore, executor_id: str, chunk_lines: int,
                 retry: LineRetry | None = None) -> None:
        self.bus = bus
        self.store = store
        self.results = ResultStore(store)
        self.finalizer = Finalizer(bus, store, self.results)
        self.executor_id = executor_id
        self.chunk_lines = chunk_lines
        self.retry = retry or LineRetry()
        self.running: dict[str, BatchWatch] = {}
        """Batches this executor runs now, by id: a FinalizeBatch for one of them is handed to its attempt."""

    async def run(self, command: RunBatch, engine: Engine) -> None:
        async with BatchWatch.open(self.bus, command.batch_id, command.attempt) as watch:
            self.running[command.batch_id] = watch
            try:
                await self._attempt(command, engine, watch)
            finally:
                del self.running[command.batch_id]

    async def _attempt(self, command: RunBatch, engine: Engine, watch: BatchWatch) -> None:
        batch_id = command.batch_id
        if watch.fenced:
            log.warning("batch %s attempt %d is no longer current; nothing to do", batch_id, command.attempt)
            return
        if watch.stop_reason() is None:
            await self.bus.publish(BatchStarted(
                aggregate_id=batch_id, correlation_id=batch_id, executor_id=self.executor_id,
                attempt=command.attempt, engine=engine.name, engine_version=engine.version,
            ))
            await self._run_lines(command, engine, watch)
            if watch.fenced:
                log.warning("batch %s attempt %d fenced off; its last results are dropped", batch_id,
                            command.attempt)
                return
        reason = watch.stop_reason()
        if reason is None:
            await self.bus.publish(BatchFinalizing(aggregate_id=batch_id, correlation_id=batch_id,
                                                   attempt=command.attempt))
        code = watch.log.cancel_code if reason == "cancelled" else None
        await self.finalizer.finalize(command, reason or "completed", lambda: watch.fenced, code)

    async def _run_lines(self, command: RunBatch, engine: Engine, watch: BatchWatch) -> None:
        resume = Resume.from_chunks(await self.results.committed(command.batch_id), command.attempt)
        tally = resume.tally()
        if resume.last_chunk is not None and not watch.fenced:
            # An earlier delivery may have committed this chunk and stopped before announcing it.
            await self._announce(command, resume.last_chunk, tally.completed, tally.failed)
        log.info("batch %s attempt %d: %d lines already committed", command.batch_id, command.attempt,
                 len(resume.committed))
        committer = ChunkCommitter(self.chunk_lines, resume.next_chunk, tally)
        commit_lock = asyncio.Lock()
        slots = asyncio.Semaphore(max(engine.slots, 1))

        async def run_one(line: InputLine, slot_wait_s: float) -> None:
            try:
                reply = await traced_line(engine, command.model, command.endpoint, line.custom_id, line.body,
                                          self.retry, slot_wait_s)
            finally:
                slots.release()
            finished = result_line(command.batch_id, line, reply.status_code, reply.body)
            async with commit_lock:
                await self._commit(command, committer.add(finished), watch)

        try:
            async with asyncio.TaskGroup() as group:
                async for line in self._pending_lines(command, resume):
                    waiting_since = time.perf_counter()
                    if not await _take_slot(slots, watch.stopping):
                        break
                    group.create_task(run_one(line, time.perf_counter() - waiting_since))
        except ExceptionGroup as failures:
            # A crashed engine or a bad input line stops the attempt; surface the first cause.
            raise failures.exceptions[0] from failures
        async with commit_lock:
            await self._commit(command, committer.flush(), watch)

    async def _pending_lines(self, command: RunBatch, resume: Resume) -> AsyncIterator[InputLine]:
        number = 0
        done = resume.committed_lines  # includes lines validation refused, which may not even parse
        async for raw in self.store.iter_lines(command.input_object_key):
            number += 1
            if number in done:
                continue
            line = parse_input_line(number, raw)
            if line is not None and line.custom_id not in resume.committed:
                yield line

    async def _commit(self, command: RunBatch, chunk: Chunk | None, watch: BatchWatch) -> None:
        """Results are durable in the object store before any event says they are; a fenced attempt's never."""
        if chunk is None or watch.fenced:
            return
        await self.results.put_chunk(command.batch_id, command.attempt, chunk)
        await self._announce(command, chunk.number, chunk.completed, chunk.failed)

    async def _announce(self, command: RunBatch, chunk: int, completed: int, failed: int) -> None:
        await self.bus.publish(BatchProgressed(
            aggregate_id=command.batch_id, correlation_id=command.batch_id, attempt=command.attempt,
            chunk=chunk, chunk_key=result_chunk_key(command.batch_id, command.attempt, chunk),
            completed=completed, failed=failed,
        ))


async def _take_slot(slots: asyncio.Semaphore, stopping: asyncio.Event) -> bool:
    """Wait for a free engine slot; False (holding none) once the attempt must start no new line."""
    if stopping.is_set():
        return False
    acquiring = asyncio.ensure_future(slots.acquire())
    waiting = asyncio.ensure_future(stopping.wait())
    await asyncio.wait({acquiring, waiting}, return_when=asyncio.FIRST_COMPLETED)
    waiting.cancel()
    if not acquiring.done():
        acquiring.cancel()
        return False
    if stopping.is_set():
        slots.release()
        return False
    return True
