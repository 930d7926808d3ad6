"""The control plane's own finalizer: the leading scheduler ends a batch no executor holding its lease can end, with
its own S3 access, as an executor's `Finalizer` would (redone, the same files and facts); one task per batch, retried
after growing pauses, failing the batch after `MAX_TRIES`. Result chunks are untrusted: read one at a time within
`MAX_CHUNK_BYTES`; one too big or undecodable is left out (its lines count as never run), never failing the batch."""

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from contracts.api.output_line import CommittedLine, decode_chunk
from contracts.commands import FinalizeBatch
from contracts.events.batch import BatchFailed
from contracts.objects import MAX_CHUNK_BYTES
from services.executor.adapters.log_reader import read_batch_log
from services.executor.adapters.results import ResultStore
from services.executor.finalizer import Ender, Finalizer
from services.runtime.nats.bus import EventBus
from services.runtime.process.tasks import cancel_and_join
from services.runtime.storage.objectstore import ObjectStore, read_within

log = logging.getLogger(__name__)

MAX_TRIES = 8
AT_ONCE = 2
"""Batches the control plane assembles at the same time: the leader's memory and event loop stay its own."""
FIRST_PAUSE_S = 1.0
MAX_PAUSE_S = 30.0
STOP_S = 10.0
REASON_LIMIT = 1000
FINALIZE_FAILED = "finalize_failed"


class StillRunning(Exception):
    """The log still shows an attempt that may run (the fence the scheduler stated is not read back yet)."""


class GuardedResults(ResultStore):
    """Result chunks read one at a time within `MAX_CHUNK_BYTES`, skipping those too big or undecodable."""

    async def chunks(self, keys: Iterable[str]) -> list[tuple[str, list[CommittedLine]]]:
        read: list[tuple[str, list[CommittedLine]]] = []
        for key in sorted(keys):
            data = await read_within(self.store.iter_chunks(key), MAX_CHUNK_BYTES)
            if data is None:
                log.warning("result chunk %s is over %d bytes: left out, its lines count as never run", key,
                            MAX_CHUNK_BYTES)
                continue
            try:
                # Off the leader's loop (a chunk may be tens of MB); at most `AT_ONCE` threads at a time.
                read.append((key, await asyncio.to_thread(decode_chunk, data)))
            except ValueError as error:  # pydantic's ValidationError is one
                log.warning("result chunk %s does not decode (%s): left out, its lines count as never run", key,
                            str(error)[:200])
        return read


@dataclass
class Closer:
    bus: EventBus
    store: ObjectStore
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    tries: dict[str, int] = field(default_factory=dict)
    """Batch id → its failed tries so far (the ones that count towards `MAX_TRIES`)."""
    waits: dict[str, int] = field(default_factory=dict)
    """Batch id → tries that found an attempt still running (they pause, but never fail the batch)."""
    at_once: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(AT_ONCE))
    is_open: Callable[[str], bool] = lambda batch_id: True
    """Whether the batch has not ended (as the scheduler's book knows): a try that ends after the batch did leaves
    no pause behind."""

    def close(self, command: FinalizeBatch, given_up: Callable[[], None]) -> None:
        """Finalize `command`'s batch in the background (one try at a time per batch); `given_up` is called when a
        try ends without the batch's end stated, so the scheduler decides again."""
        running = self.tasks.get(command.batch_id)
        if running is not None and not running.done():
            return
        task = asyncio.create_task(self._try(command, given_up), name=f"finalize {command.batch_id}")
        self.tasks[command.batch_id] = task

        def forget(done: asyncio.Task[None]) -> None:
            if self.tasks.get(command.batch_id) is done:
                del self.tasks[command.batch_id]
        task.add_done_callback(forget)

    def forget(self, batch_id: str) -> None:
        """The batch ended (whoever ended it): its pauses are forgotten, so the book of them holds open batches only."""
        self.tries.pop(batch_id, None)
        self.waits.pop(batch_id, None)

    async def _try(self, command: FinalizeBatch, given_up: Callable[[], None]) -> None:
        batch_id = command.batch_id
        finished = False
        try:
            pauses = self.tries.get(batch_id, 0) + self.waits.get(batch_id, 0)
            if pauses:
                await asyncio.sleep(min(FIRST_PAUSE_S * 2 ** (pauses - 1), MAX_PAUSE_S))
            async with self.at_once:
                await self.finalize(command)
            finished = True
            self.tries.pop(batch_id, None)
            self.waits.pop(batch_id, None)
        except StillRunning as running:
            if self.is_open(batch_id):
                self.waits[batch_id] = self.waits.get(batch_id, 0) + 1
            log.info("batch %s: %s; finalizing it later", batch_id, running)
        except Exception as error:  # any failure: tried again, then the batch fails with it
            if not self.is_open(batch_id):  # ended meanwhile, by another: nothing to try again
                log.info("finalizing batch %s failed (%r), but it has ended", batch_id, error)
                return
            tries = self.tries[batch_id] = self.tries.get(batch_id, 0) + 1
            if tries >= MAX_TRIES:
                finished = await self._fail(command, error)
            else:
                log.warning("finalizing batch %s (%s) failed (try %d): %r", batch_id, command.reason, tries, error)
        finally:
            if not finished:
                given_up()

    async def finalize(self, command: FinalizeBatch) -> None:
        batch_log = await read_batch_log(self.bus, command.batch_id)
        if batch_log.ended is not None:
            return
        live = batch_log.live_attempt()
        if live is not None:
            raise StillRunning(f"attempt {live} may still run")
        finalizer = Finalizer(self.bus, self.store, GuardedResults(self.store))
        await finalizer.finish(command, command.reason,
                               Ender(batch_log, lambda: read_batch_log(self.bus, command.batch_id)))
        log.info("batch %s (asked: %s) finalized by the control plane", command.batch_id, command.reason)

    async def _fail(self, command: FinalizeBatch, error: Exception) -> bool:
        """State that the batch failed with the cause; False when even that could not be stored (tried again)."""
        cause = f"Its output and error files could not be assembled ({command.reason}): {error!r}"
        if command.reason == "failed" and command.failure_message:
            cause = f"{command.failure_message} {cause}"
        log.error("batch %s fails: %s", command.batch_id, cause)
        try:
            await self.bus.publish(BatchFailed(aggregate_id=command.batch_id,
                                               code=command.failure_code or FINALIZE_FAILED,
                                               reason=cause[:REASON_LIMIT]))
        except Exception as failed:  # the broker: the next try states it
            log.warning("could not state that batch %s failed: %r", command.batch_id, failed)
            return False
        self.tries.pop(command.batch_id, None)
        return True

    async def stop(self) -> None:
        await cancel_and_join(list(self.tasks.values()), STOP_S)
