"""Thin handlers (`executor_router`): a RunBatch command in, a batch run, its facts out, a hopeless one failing the
attempt; a FinalizeBatch ends a batch that runs nowhere, one that cannot succeed failing the batch with its cause."""

import logging

from contracts.commands import FinalizeBatch, RunBatch
from contracts.events.batch import (
    AttemptFailed,
    BatchCancelled,
    BatchCompleted,
    BatchExpired,
    BatchFailed,
    BatchFinalizing,
    BatchProgressed,
    BatchStarted,
    ShardFinished,
)
from contracts.events.file import FileStored
from services.executor.adapters.desk import FactRefused
from services.executor.adapters.engines.shelf import EngineShelf
from services.executor.adapters.log_reader import read_batch_log
from services.executor.durables import executor_durables, run_workers
from services.executor.finalizer import Ender
from services.executor.runner import BatchRunner
from services.runtime.nats.bus import EventBus, FenceMoved, PoisonMessage
from services.runtime.nats.delivery import ServiceRouter
from services.runtime.storage.objectstore import ObjectNotFound
from services.runtime.storage.write_failures import through_write_faults, write_fault

log = logging.getLogger(__name__)

REASON_LIMIT = 1000
HOPELESS = (ValueError, TypeError, RecursionError, ObjectNotFound)
"""Failures a retry would meet again (an unparsable line or chunk, a deleted input): given up at once."""
FINALIZE_FAILED = "finalize_failed"
STORAGE_UNAVAILABLE = "storage_unavailable"
"""An attempt given up on a write fault (services/runtime/storage/write_failures.py): not counted against its unit."""


class FinalizeDeferred(Exception):
    """An attempt still runs the batch; it finalizes the batch itself, or fails and this retries later."""


class Executor:
    """What the executor does with each command it takes, and with one given up on."""

    def __init__(self, bus: EventBus, runner: BatchRunner, engines: EngineShelf, executor_id: str) -> None:
        self.bus = bus
        self.runner = runner
        self.engines = engines
        self.executor_id = executor_id

    async def run(self, command: RunBatch) -> None:
        if command.executor_id != self.executor_id:
            raise PoisonMessage(f"command for executor {command.executor_id} reached {self.executor_id}")
        engine = await self.engines.get(command.model)
        if engine is None:
            raise PoisonMessage(f"model {command.model} is not served by executor {self.executor_id}")
        try:
            # A full disk or a broker restarting is waited out here, spending none of the command's deliveries: the
            # run resumes idempotently, past the lines already committed.
            await through_write_faults(lambda: self.runner.run(command, engine),
                                       f"batch {command.batch_id} attempt {command.attempt}")
        except HOPELESS as error:
            raise PoisonMessage(f"{type(error).__name__}: {error}") from error

    async def fail_the_attempt(self, command: RunBatch, error: BaseException) -> None:
        # The attempt failed, not the batch: the scheduler retries it elsewhere, up to its attempt limit.
        reason = f"attempt {command.attempt} on executor {self.executor_id} failed: {error}"
        code = STORAGE_UNAVAILABLE if write_fault(error) is not None else "executor_error"
        try:
            await self.bus.publish(AttemptFailed(aggregate_id=command.batch_id, attempt=command.attempt,
                                                 executor_id=self.executor_id, code=code,
                                                 reason=reason[:REASON_LIMIT]))
        except (FenceMoved, FactRefused) as refused:
            # Fenced already (or its facts refused): its failure is known, and a retry would meet the same answer.
            log.info("attempt %d of batch %s not recorded as failed (%r): it is fenced already", command.attempt,
                     command.batch_id, refused)

    async def finalize(self, command: FinalizeBatch) -> None:
        if command.executor_id != self.executor_id:
            raise PoisonMessage(f"finalize command for executor {command.executor_id} reached {self.executor_id}")
        batch_log = await read_batch_log(self.bus, command.batch_id)
        if batch_log.ended is not None:
            log.info("batch %s already ended (%s); nothing to finalize", command.batch_id, batch_log.ended)
            return
        live = batch_log.live_attempt()
        if live is not None:
            # The scheduler fences what runs before it sends this; a log read this early may not show it yet.
            if command.reason in ("cancelled", "expired"):
                for running in self.runner.attempts_of(command.batch_id):  # every shard of it running here
                    running.request_stop("cancelled" if command.reason == "cancelled" else "expired")
            raise FinalizeDeferred(f"attempt {live} of batch {command.batch_id} may still run")
        try:
            await self.runner.finalizer.finish(command, command.reason,
                                               Ender(batch_log, lambda: read_batch_log(self.bus, command.batch_id)))
        except HOPELESS as error:
            raise PoisonMessage(f"{type(error).__name__}: {error}") from error
        self.runner.forget(command.batch_id)  # its input copy here is not needed any more

    async def fail_the_batch(self, command: FinalizeBatch, error: BaseException) -> None:
        """A finalize that cannot succeed ends its batch as failed, with the cause: it must not wait forever, nor
        hold a place in this executor's durable that other users' cancels and expiries need."""
        if command.executor_id != self.executor_id:
            return  # not this executor's batch to fail
        if (await read_batch_log(self.bus, command.batch_id)).ended is not None:
            return
        cause = f"Its output and error files could not be assembled ({command.reason}): {error}"
        if command.reason == "failed" and command.failure_message:
            cause = f"{command.failure_message} {cause}"
        log.error("batch %s fails: %s", command.batch_id, cause)
        await self.bus.publish(BatchFailed(aggregate_id=command.batch_id, code=command.failure_code or FINALIZE_FAILED,
                                           reason=cause[:REASON_LIMIT]))


def executor_router(executor_id: str, ack_wait_s: float, max_deliver: int, parallel_attempts: int = 1) -> ServiceRouter:
    """One executor's table: the commands it takes, by which handler, what a hopeless one becomes; its facts."""
    router = ServiceRouter("executor", dependencies="executor")
    runs, finals = executor_durables(executor_id, ack_wait_s, max_deliver, parallel_attempts)
    router.durable(runs, Executor.run, Executor.fail_the_attempt,
                   "Run the batch (or its shard) on this executor's engine, committing result chunks under the "
                   "attempt's lease; a command that can never run fails the attempt (the scheduler retries it). "
                   "Several attempts run at once, sharing the engine's slots fairly between batch owners.",
                   max_workers=run_workers(parallel_attempts))
    router.durable(finals, Executor.finalize, Executor.fail_the_batch,
                   "Assemble the output and error files of a batch that runs nowhere (completed shards, a cancel, "
                   "an expiry, a failure) and end it; one that can never be assembled fails the batch.")
    router.emits(BatchStarted, BatchProgressed, ShardFinished, BatchFinalizing, FileStored, BatchCompleted,
                 BatchCancelled, BatchExpired, BatchFailed, AttemptFailed)
    return router
