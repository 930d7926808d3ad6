"""Running one batch attempt: skip committed lines, run the rest concurrently, commit chunks, finalize."""

import asyncio
import logging
from collections.abc import AsyncIterator

from contracts.commands import RunBatch
from contracts.events.batch import BatchCompleted, BatchFinalizing, BatchProgressed, BatchStarted
from contracts.ids import error_file_id, output_file_id
from contracts.subjects import result_chunk_key
from services.executor.adapters.engines.base import Engine
from services.executor.adapters.results import ResultStore
from services.executor.domain import (
    Chunk,
    ChunkCommitter,
    CommittedLine,
    InputLine,
    Resume,
    assemble,
    parse_input_line,
    result_line,
    usage_of,
)
from services.runtime.bus import EventBus
from services.runtime.objectstore import ObjectStore

log = logging.getLogger(__name__)


class BatchRunner:
    """Every step is idempotent: a redelivered command redoes nothing committed and republishes the same ids."""

    def __init__(self, bus: EventBus, store: ObjectStore, executor_id: str, chunk_lines: int) -> None:
        self.bus = bus
        self.store = store
        self.results = ResultStore(store)
        self.executor_id = executor_id
        self.chunk_lines = chunk_lines

    async def run(self, command: RunBatch, engine: Engine) -> None:
        batch_id = command.batch_id
        await self.bus.publish(BatchStarted(
            aggregate_id=batch_id, correlation_id=batch_id, executor_id=self.executor_id,
            attempt=command.attempt, engine=engine.name, engine_version=engine.version,
        ))
        resume = Resume.from_chunks(await self.results.committed(batch_id), command.attempt)
        tally = resume.tally()
        if resume.last_chunk is not None:
            # An earlier delivery may have committed this chunk and stopped before announcing it.
            await self._announce(command, resume.last_chunk, tally.completed, tally.failed)
        log.info("batch %s attempt %d: %d lines already committed", batch_id, command.attempt,
                 len(resume.committed))
        committer = ChunkCommitter(self.chunk_lines, resume.next_chunk, tally)
        fresh = await self._run_lines(command, engine, resume, committer)
        await self.bus.publish(BatchFinalizing(aggregate_id=batch_id, correlation_id=batch_id,
                                               attempt=command.attempt))
        await self._finalize(command, [*resume.committed.values(), *fresh])

    async def _run_lines(self, command: RunBatch, engine: Engine, resume: Resume,
                         committer: ChunkCommitter) -> list[CommittedLine]:
        fresh: list[CommittedLine] = []
        commit_lock = asyncio.Lock()
        slots = asyncio.Semaphore(max(engine.slots, 1))

        async def run_one(line: InputLine) -> None:
            try:
                reply = await engine.run(command.endpoint, line.body)
            finally:
                slots.release()
            finished = result_line(command.batch_id, line, reply.status_code, reply.body)
            async with commit_lock:
                fresh.append(finished)
                await self._commit(command, committer.add(finished))

        try:
            async with asyncio.TaskGroup() as group:
                async for line in self._pending_lines(command, resume):
                    await slots.acquire()
                    group.create_task(run_one(line))
        except ExceptionGroup as failures:
            # A crashed engine or a bad input line stops the attempt; surface the first cause.
            raise failures.exceptions[0] from failures
        async with commit_lock:
            await self._commit(command, committer.flush())
        return fresh

    async def _pending_lines(self, command: RunBatch, resume: Resume) -> AsyncIterator[InputLine]:
        number = 0
        async for raw in self.store.iter_lines(command.input_object_key):
            number += 1
            line = parse_input_line(number, raw)
            if line is not None and line.custom_id not in resume.committed:
                yield line

    async def _commit(self, command: RunBatch, chunk: Chunk | None) -> None:
        """Results are durable in the object store before any event says they are."""
        if chunk is None:
            return
        await self.results.put_chunk(command.batch_id, command.attempt, chunk)
        await self._announce(command, chunk.number, chunk.completed, chunk.failed)

    async def _announce(self, command: RunBatch, chunk: int, completed: int, failed: int) -> None:
        await self.bus.publish(BatchProgressed(
            aggregate_id=command.batch_id, correlation_id=command.batch_id, attempt=command.attempt,
            chunk=chunk, chunk_key=result_chunk_key(command.batch_id, command.attempt, chunk),
            completed=completed, failed=failed,
        ))

    async def _finalize(self, command: RunBatch, lines: list[CommittedLine]) -> None:
        batch_id = command.batch_id
        files = assemble(lines)
        output_id = error_id = None
        if files.output_lines:
            output_id = output_file_id(batch_id)
            await self.bus.publish(await self.results.put_file(
                output_id, files.output, command.owner_key_id, f"{batch_id}_output.jsonl", files.output_lines))
        if files.error_lines:
            error_id = error_file_id(batch_id)
            await self.bus.publish(await self.results.put_file(
                error_id, files.errors, command.owner_key_id, f"{batch_id}_error.jsonl", files.error_lines))
        await self.bus.publish(BatchCompleted(
            aggregate_id=batch_id, correlation_id=batch_id, output_file_id=output_id, error_file_id=error_id,
            completed=files.output_lines, failed=files.error_lines, usage=usage_of(lines),
        ))
