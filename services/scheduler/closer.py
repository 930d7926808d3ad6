"""The control plane's own finalizer: a batch that no executor holding its lease can end is ended by the leading
scheduler itself.

That is every batch that never ran (cancelled while held or queued, expired in the queue), one whose units ran on
several executors, and one whose executor is gone. It writes the output and error files from the committed chunks
(and every other line with the batch's code) with the scheduler's own S3 access and states the end straight into
the log, as an executor's finalize would (the same `Finalizer`: redone, it writes the same files and facts). One
task per batch, all stopped with the term; a failed try is tried again after a growing pause, and a batch whose
files cannot be written after `MAX_TRIES` fails with the cause.
"""

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from contracts.commands import FinalizeBatch
from contracts.events.batch import BatchFailed, BatchFinalizing
from services.executor.adapters.log_reader import read_batch_log
from services.executor.adapters.results import ResultStore
from services.executor.attempts import counts_as_committed
from services.executor.finalizer import Finalizer
from services.runtime.bus import EventBus
from services.runtime.objectstore import ObjectStore
from services.runtime.tasks import cancel_and_join

log = logging.getLogger(__name__)

MAX_TRIES = 8
FIRST_PAUSE_S = 1.0
MAX_PAUSE_S = 30.0
STOP_S = 10.0
REASON_LIMIT = 1000
FINALIZE_FAILED = "finalize_failed"


class StillRunning(Exception):
    """The log still shows an attempt that may run (the fence the scheduler stated is not read back yet)."""


@dataclass
class Closer:
    bus: EventBus
    store: ObjectStore
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    tries: dict[str, int] = field(default_factory=dict)

    def close(self, command: FinalizeBatch, given_up: Callable[[], None]) -> None:
        """Finalize `command`'s batch in the background (once at a time per batch); `given_up` is called when this
        try failed, so the scheduler decides again (and may call this again)."""
        if command.batch_id in self.tasks:
            return
        task = asyncio.create_task(self._try(command, given_up), name=f"finalize {command.batch_id}")
        self.tasks[command.batch_id] = task
        task.add_done_callback(lambda _: self.tasks.pop(command.batch_id, None))

    async def _try(self, command: FinalizeBatch, given_up: Callable[[], None]) -> None:
        batch_id = command.batch_id
        tries = self.tries.get(batch_id, 0)
        if tries:
            await asyncio.sleep(min(FIRST_PAUSE_S * 2 ** (tries - 1), MAX_PAUSE_S))
        try:
            await self.finalize(command)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # any failure: tried again, then the batch fails with it
            self.tries[batch_id] = tries + 1
            if isinstance(error, StillRunning):
                log.info("batch %s: %s; finalizing it later", batch_id, error)
            elif tries + 1 >= MAX_TRIES:
                await self._fail(command, error)
            else:
                log.warning("finalizing batch %s (%s) failed (try %d): %r", batch_id, command.reason, tries + 1,
                            error)
            given_up()
        else:
            self.tries.pop(batch_id, None)

    async def finalize(self, command: FinalizeBatch) -> None:
        batch_log = await read_batch_log(self.bus, command.batch_id)
        if batch_log.ended is not None:
            return
        live = batch_log.live_attempt()
        if live is not None:
            raise StillRunning(f"attempt {live} may still run")
        if command.reason == "completed":
            await self.bus.publish(BatchFinalizing(aggregate_id=command.batch_id, attempt=0))
        finalizer = Finalizer(self.bus, self.store, ResultStore(self.store))
        await finalizer.finalize(command, command.reason, counts_as_committed(batch_log.announced), code=command.code,
                                 holds=batch_log.holds_line)
        log.info("batch %s (%s) finalized by the control plane", command.batch_id, command.reason)

    async def _fail(self, command: FinalizeBatch, error: Exception) -> None:
        cause = f"Its output and error files could not be assembled ({command.reason}): {error!r}"
        if command.reason == "failed" and command.failure_message:
            cause = f"{command.failure_message} {cause}"
        log.error("batch %s fails: %s", command.batch_id, cause)
        await self.bus.publish(BatchFailed(aggregate_id=command.batch_id, code=command.failure_code or FINALIZE_FAILED,
                                           reason=cause[:REASON_LIMIT]))

    async def stop(self) -> None:
        await cancel_and_join(list(self.tasks.values()), STOP_S)
