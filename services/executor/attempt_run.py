"""One attempt, run (`AttemptRun`): what it states goes out under its lease; its unit's uncommitted lines go through
the engine's slot pool, committed chunk by chunk. On cancel or expiry the lines in the engine are stopped (no GPU
time for answers that would be thrown away; they end as never run)."""

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from contracts.api.batch import BatchUsage
from contracts.commands import RunBatch
from contracts.events.batch import BatchProgressed, BatchStarted
from contracts.events.envelope import Event
from contracts.ids import output_file_id
from contracts.objects import AHEAD, WantedObject
from contracts.subjects import attempt_failures, input_object_key, result_chunk_key
from services.executor.adapters.brokered_store import BrokeredObjectStore
from services.executor.adapters.desk import publish_in_order
from services.executor.adapters.engines.base import Engine, on_slot
from services.executor.adapters.input_cache import InputCopy
from services.executor.adapters.watch import BatchWatch
from services.executor.chunk_lines import ResultLine
from services.executor.domain import (
    Chunk,
    ChunkCommitter,
    InputLine,
    Resume,
    Tally,
    finished_line,
    parse_input_line,
    usage_of,
)
from services.executor.held_slot import HeldSlot
from services.executor.observe import traced_line, tracing
from services.executor.prefixes import prefix_key
from services.executor.slots import SlotPool
from services.runtime.nats.bus import Fence, FenceMoved

if TYPE_CHECKING:
    from services.executor.runner import BatchRunner

log = logging.getLogger(__name__)

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
    """One attempt running here (a delivery of its run command)."""

    runner: "BatchRunner"
    command: RunBatch
    engine: Engine
    watch: BatchWatch
    start: BatchStarted
    """Stated once its first line has an engine slot (or before it states anything else): an attempt waiting for
    the slots of others is not started, so the loss of its executor is not held against its lines."""
    started: bool = False
    announced: set[str] = field(default_factory=set)
    """Chunk keys it announced (its watch may not have read them back yet)."""
    in_hand: list[tuple[str, Sequence[ResultLine]]] | None = None
    """Unsharded, the chunks it read on resuming or committed: it finalizes without reading them back."""
    resume: Resume = field(init=False, repr=False)
    committer: ChunkCommitter = field(init=False, repr=False)
    slots: SlotPool = field(init=False, repr=False)
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
    begin_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """`started` is stated once, by whichever gets there first: its first line's slot, a commit, or its end."""
    beginning: "asyncio.Task[None] | None" = None
    """Stating `started` while the first line runs (its commit waits for it), so no round trip delays the line."""

    async def publish(self, *events: Event) -> bool:
        """Publish in order while this attempt holds its lease; False (nothing more written) once it does not."""
        fence_subject = attempt_failures(self.command.batch_id)
        while not self.watch.fenced:
            try:
                await publish_in_order(self.runner.bus, events, Fence(fence_subject, self.watch.log.fence_sequence))
                self.announced.update(event.chunk_key for event in events if isinstance(event, BatchProgressed))
                return True
            except FenceMoved as moved:
                # Another attempt failed since (maybe this one): read the log that far, then judge.
                if not await self.watch.feed.caught_up_to(moved.last_sequence):
                    raise
        return False

    async def begin(self) -> bool:
        """State `started` unless stated already (or waits while it is being stated); False once the attempt's lease
        is gone."""
        async with self.begin_lock:
            if not self.started:
                self.started = await self.publish(self.start)
        return self.started

    async def _begin_or_stop(self) -> None:
        """State `started` as the first line runs; a lease found lost stops the lines: nothing of theirs commits."""
        if not await self.begin():
            self._lose_lease()
            self._stop_lines()

    async def run(self, first_run: bool = False) -> list[Event] | None:
        """Run the shard's uncommitted lines: its last chunk's progress fact, for the end to state; None: lease lost."""
        command, runner = self.command, self.runner
        self.resume = resume = await self._resume(first_run)
        tally = resume.tally(command.layout, command.shard)
        if resume.last_chunk is not None and not (await self.begin() and await self.publish(self._progressed(
                resume.last_chunk, tally.completed, tally.failed, resume.last_chunk_usage))):
            # An earlier delivery may have committed this chunk and stopped before announcing it.
            return None
        log.info("batch %s attempt %d (shard %d of %d): %d of its lines already committed",
                 command.batch_id, command.attempt, command.shard + 1, command.layout.shards, len(resume.committed))
        if isinstance(runner.store, BrokeredObjectStore):
            await runner.store.ask_ahead(command.batch_id, command.attempt, self._ahead(tally))
        self.committer = ChunkCommitter(runner.chunk_lines, resume.next_chunk, tally, runner.chunk_max_wait_s)
        self.slots = runner.pools.setdefault(self.engine, SlotPool(self.engine.slots))
        clock = asyncio.create_task(self.commit_on_time()) if runner.chunk_max_wait_s < float("inf") else None
        stopper = asyncio.create_task(self.stop_lines_on_cancel())
        try:
            await self._feed_lines(self._to_run(tally))
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
        if self.watch.stop_reason() is None and not await self.begin():  # it had no line to run: started all the same
            return None
        return [last] if last is not None else []

    def _to_run(self, tally: Tally) -> int:
        """The shard's lines no attempt committed (about: refused lines count as committed)."""
        layout, shard = self.command.layout, self.command.shard
        first, last = layout.first_line(shard), layout.last_line(shard) or self.command.total_lines
        return max(last - first + 1 - tally.completed - tally.failed, 0)

    def _ahead(self, tally: Tally) -> list[WantedObject]:
        """The objects the run gets and puts: its input (unless copied here), its chunks and (unsharded) the output."""
        command, next_chunk = self.command, self.resume.next_chunk
        chunks = -(-self._to_run(tally) // self.runner.chunk_lines)
        wanted = [] if command.batch_id in self.runner.inputs.copies else [
            WantedObject(operation="get", key=command.terms.input_object_key)]
        if not command.sharded:
            wanted.append(WantedObject(operation="put", key=input_object_key(output_file_id(command.batch_id))))
        wanted.extend(WantedObject(operation="put", key=result_chunk_key(command.batch_id, command.attempt, number))
                      for number in range(next_chunk, next_chunk + min(chunks, AHEAD)))
        return wanted

    async def _resume(self, first_run: bool) -> Resume:
        """Its committed lines: chunks announced for its shard, its own (none on a first run), refused lines."""
        command, results = self.command, self.runner.results
        layout, shard = command.layout, command.shard
        keys = self.watch.log.unit_chunks(shard, layout)
        if not first_run:
            keys.update(await results.attempt_chunk_keys(command.batch_id, command.attempt))
        chunks = list(await results.chunks(keys))
        chunks.extend(await results.refused(command.batch_id, lambda line: layout.shard_of(line) == shard,
                                            command.rejections_object_key))
        if not command.sharded:  # a unit of a sharded batch never finalizes it: nothing to keep
            self.in_hand = list(chunks)
        return Resume.from_chunks(chunks, command.attempt)

    async def _feed_lines(self, to_run: int) -> None:
        """Pending lines to the slot pool, `PLAN_LINES` planned together by prefix, until none is left or it stops
        (`to_run`: about how many; the pool weighs a batch by its lines left)."""
        command, watch, owner = self.command, self.watch, self.command.terms.owner_key_id
        planned = 0
        async with self.runner.inputs.hold(command.batch_id, command.terms.input_object_key) as copy, \
                contextlib.aclosing(self._pending_lines(copy, watch.stopping)) as pending, \
                asyncio.TaskGroup() as group:
            while lines := [line async for line in _take(pending, PLAN_LINES)]:
                keyed = self.engine.prompt_cache_per_slot
                planned += len(lines)
                with self.slots.unit([prefix_key(command.terms.endpoint, line.body, owner) if keyed else None
                                      for line in lines], command.batch_id, to_run - planned) as unit:
                    waiting_since = time.perf_counter()
                    while (started := await unit.next(owner, watch.stopping)) is not None:
                        index, slot = started
                        if self.beginning is None and not self.started:
                            # Its first line has a slot: the attempt runs from now on, stated as the line starts.
                            self.beginning = group.create_task(self._begin_or_stop())
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
            if self.lease_lost:
                return  # its lease was found lost as its slot came: nothing of it would commit
            with on_slot(slot.index):
                self.in_engine.add(task)
                try:
                    reply = await traced_line(self.engine, command.model, command.terms.endpoint, line.custom_id,
                                              line.body, self.runner.retry, slot_wait_s, self.traced)
                except asyncio.CancelledError:
                    if task in self.stopped and task.uncancel() == 0:
                        return  # stopped by the batch's cancel or expiry, or a lost lease (and by nothing else)
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
        if chunk is not None and not await self.begin():  # `started` goes first, whichever line was quicker
            self._lose_lease()
            return
        progressed = await self.write(chunk)
        if progressed is not None and not await self.publish(progressed):
            self._lose_lease()

    async def write(self, chunk: Chunk | None) -> BatchProgressed | None:
        """Write the chunk (durable before a fact announces it): that fact; None: nothing to write, or a lost lease."""
        if chunk is None or self.lease_lost:
            return None
        command = self.command
        try:
            key = await self.runner.results.put_chunk(command.batch_id, command.attempt, chunk)
        except PermissionError as refused:
            # A brokered store is refused the write once the attempt's lease is gone: the same fence, earlier.
            log.warning("batch %s attempt %d: chunk %d refused (%s); the lease is lost", command.batch_id,
                        command.attempt, chunk.number, refused)
            self._lose_lease()
            return None
        except BaseException as error:
            # Whoever made the chunk (a line's task, or the clock, whose failure nobody awaits) ends the attempt
            # at its next chunk at the latest: no later chunk states counts that include these lines.
            self.committer.unwritten = error if isinstance(error, Exception) else RuntimeError(
                f"chunk {chunk.number}'s write was stopped ({type(error).__name__})")
            raise
        if self.in_hand is not None:
            self.in_hand.append((key, list(chunk.lines)))
        return self._progressed(chunk.number, chunk.completed, chunk.failed, usage_of(chunk.lines))

    def _progressed(self, chunk: int, completed: int, failed: int, usage: BatchUsage | None) -> BatchProgressed:
        command = self.command
        return BatchProgressed(aggregate_id=command.batch_id, attempt=command.attempt, chunk=chunk,
                               chunk_key=result_chunk_key(command.batch_id, command.attempt, chunk),
                               completed=completed, failed=failed, shard=command.shard, usage=usage)

    def _lose_lease(self) -> None:
        self.lease_lost = True
        self.watch.stopping.set()

    async def commit_on_time(self) -> None:
        """Commit lines waiting `chunk_max_wait_s`; ended by `lines_done`, never cancelled: a taken chunk commits."""
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
        if self.watch.stop_reason() is not None:  # cancelled or expired; a lease lost mid-run lets lines finish
            self._stop_lines()

    def _stop_lines(self) -> None:
        """Stop the lines in the engine: they end as never run."""
        for task in list(self.in_engine):
            self.stopped.add(task)
            task.cancel()

    async def _pending_lines(self, copy: InputCopy, stop: asyncio.Event) -> AsyncGenerator[InputLine, None]:
        """The shard's lines no attempt committed, read from the batch's local copy; none more once `stop` is set."""
        done = self.resume.committed  # by line: includes lines validation refused, which may not even parse
        layout, shard = self.command.layout, self.command.shard
        async with contextlib.aclosing(copy.lines(layout.first_line(shard), layout.last_line(shard), stop)) as lines:
            async for number, raw in lines:
                if number in done:
                    continue
                line = parse_input_line(number, raw)
                if line is not None:
                    yield line
