"""One attempt's lines, run: the lines of its unit no attempt committed go through the engine's slot pool, each in a
task of its own, and their results are committed chunk by chunk under the attempt's lease (`AttemptRun`). A chunk
whose lines finished and then waited `chunk_max_wait_s` is committed anyway; once the batch is cancelled or expired,
the lines in the engine are stopped (no GPU time for answers that would be thrown away; they end as never run).
"""

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from contracts.commands import RunBatch
from contracts.events.batch import BatchProgressed
from contracts.events.envelope import Event
from services.executor.adapters.engines.base import Engine, on_slot
from services.executor.adapters.watch import BatchWatch
from services.executor.domain import Chunk, ChunkCommitter, InputLine, Resume, finished_line
from services.executor.finalizer import Publish
from services.executor.observe import traced_line, tracing
from services.executor.prefixes import prefix_key
from services.executor.slots import HeldSlot, SlotPool

if TYPE_CHECKING:
    from services.executor.runner import BatchRunner

PLAN_LINES = 64
"""Lines planned together by prefix (a unit's, at most this many at a time)."""


async def _take(lines: AsyncIterator[InputLine], count: int) -> AsyncIterator[InputLine]:
    """The next `count` lines at most (the rest stay for the next call)."""
    for _ in range(count):
        try:
            yield await anext(lines)
        except StopAsyncIteration:
            return


@dataclass
class AttemptRun:
    runner: "BatchRunner"
    command: RunBatch
    engine: Engine
    watch: BatchWatch
    publish: Publish
    resume: Resume
    committer: ChunkCommitter
    slots: SlotPool
    lease_lost: bool = False
    """Set once a commit was refused: the attempt's lease is gone, nothing more is committed."""
    commit_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Chunks are committed one at a time, in their order."""
    in_engine: set["asyncio.Task[None]"] = field(default_factory=set)
    """The lines being generated now."""
    stopped: set["asyncio.Task[None]"] = field(default_factory=set)
    """The lines a cancel or an expiry stopped (their tasks were cancelled while in the engine)."""
    lines_done: asyncio.Event = field(default_factory=asyncio.Event)
    traced: bool = field(default_factory=tracing)

    async def run(self) -> list[Event] | None:
        """Run every pending line: the progress of the last chunk, written but left for the attempt's end to
        announce; None once the lease is lost."""
        clock = asyncio.create_task(self.commit_on_time()) if self.runner.chunk_max_wait_s < float("inf") else None
        stopper = asyncio.create_task(self.stop_lines_on_cancel())
        try:
            await self._feed_lines()
        except ExceptionGroup as failures:
            # A crashed engine or a bad input line stops the attempt; surface the first cause.
            raise failures.exceptions[0] from failures
        finally:
            self.lines_done.set()
            stopper.cancel()
            await asyncio.gather(stopper, return_exceptions=True)
            if clock is not None:
                await asyncio.gather(clock, return_exceptions=True)
        async with self.commit_lock:
            last = await self.write(self.committer.flush())
        if self.lease_lost or self.watch.fenced:
            return None
        return [last] if last is not None else []

    async def _feed_lines(self) -> None:
        """The pending lines to the slot pool, a batch of `PLAN_LINES` planned together (by prompt prefix), each
        started in the task group as a slot frees up for this owner, until none is left or the batch stops."""
        command, watch, owner = self.command, self.watch, self.command.terms.owner_key_id
        async with self.runner.inputs.hold(command.batch_id, command.terms.input_object_key) as copy, \
                contextlib.aclosing(self.runner.pending_lines(command, self.resume, copy, watch.stopping)) as pending, \
                asyncio.TaskGroup() as group:
            while lines := [line async for line in _take(pending, PLAN_LINES)]:
                keyed = self.engine.prompt_cache_per_slot
                with self.slots.unit([prefix_key(command.terms.endpoint, line.body, owner) if keyed else None
                                      for line in lines]) as unit:
                    waiting_since = time.perf_counter()
                    while (started := await unit.next(owner, watch.stopping)) is not None:
                        index, slot = started
                        # A task the group cancels before it starts (a sibling failed) never runs its `finally`.
                        group.create_task(self.run_one(lines[index], time.perf_counter() - waiting_since, slot)
                                          ).add_done_callback(slot.give_back)
                        waiting_since = time.perf_counter()
                if watch.stopping.is_set():
                    break

    async def run_one(self, line: InputLine, slot_wait_s: float, slot: HeldSlot) -> None:
        task = asyncio.current_task()
        assert task is not None  # a line runs in a task of its own
        command = self.command
        try:
            with on_slot(slot.index):
                self.in_engine.add(task)
                try:
                    reply = await traced_line(self.engine, command.model, command.terms.endpoint, line.custom_id,
                                              line.body, self.runner.retry, slot_wait_s, self.traced)
                except asyncio.CancelledError:
                    if task in self.stopped and task.uncancel() == 0:
                        return  # stopped by the batch's cancel or expiry (and by nothing else): never ran
                    raise
                finally:
                    self.in_engine.discard(task)
        finally:
            slot.give_back()  # before the commit: the engine goes on with the next line meanwhile
        chunk = self.committer.add(finished_line(command.batch_id, line, reply.status_code, reply.body),
                                   time.monotonic())
        if chunk is not None:  # the lock keeps chunks committed one at a time, in their order
            async with self.commit_lock:
                await self.commit(chunk)

    async def commit(self, chunk: Chunk | None) -> None:
        progressed = await self.write(chunk)
        if progressed is not None and not await self.publish(progressed):
            self._lose_lease()

    async def write(self, chunk: Chunk | None) -> BatchProgressed | None:
        """The chunk written; the fact that announces it (None: nothing to write, or the lease is lost)."""
        if chunk is None or self.lease_lost:
            return None
        progressed = await self.runner.commit(self.command, chunk)
        if progressed is None:
            self._lose_lease()
        return progressed

    def _lose_lease(self) -> None:
        self.lease_lost = True
        self.watch.stopping.set()

    async def commit_on_time(self) -> None:
        """Lines finished and then nothing for `chunk_max_wait_s`: committed anyway (progress keeps moving).
        Stopped by `lines_done`, never cancelled: a chunk taken from the committer is always committed."""
        every = min(self.runner.chunk_max_wait_s / 2, 1.0)
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.lines_done.wait(), every)
                return
            async with self.commit_lock:
                if self.committer.due(time.monotonic()):
                    await self.commit(self.committer.flush())

    async def stop_lines_on_cancel(self) -> None:
        await self.watch.stopping.wait()
        if self.watch.stop_reason() is not None:  # cancelled or expired; a lost lease lets lines finish as before
            for task in list(self.in_engine):
                self.stopped.add(task)
                task.cancel()
