"""Thin handlers: a RunBatch command in, a batch run, its facts out; a hopeless command fails the attempt.
A FinalizeBatch command ends a batch that runs nowhere; one that cannot succeed fails the batch with its cause."""

import logging

from nats.aio.msg import Msg
from pydantic import ValidationError

from contracts.commands import FinalizeBatch, RunBatch
from contracts.events.batch import AttemptFailed, BatchFailed, BatchFinalizing
from services.executor.adapters.engines.shelf import EngineShelf
from services.executor.adapters.watch import read_batch_log
from services.executor.attempts import counts_as_committed
from services.executor.runner import BatchRunner
from services.runtime.bus import ConsumerPolicy, EventBus, PoisonMessage
from services.runtime.objectstore import ObjectNotFound

log = logging.getLogger(__name__)

REASON_LIMIT = 1000
HOPELESS = (ValueError, TypeError, RecursionError, ObjectNotFound)
"""Failures that a retry would meet again (an input line or result chunk that does not parse, an input file
deleted under the batch): given up at once. Others (the broker, the object store) are retried with backoff."""
FINALIZE_FAILED = "finalize_failed"
FINALIZE_DELIVERIES = 30
"""Tries of one finalize command (backoff up to 10 s between them: about 4 minutes) before its batch fails."""
FINALIZE_PENDING = 4096


class FinalizeDeferred(Exception):
    """An attempt still runs the batch; it finalizes the batch itself, or fails and this retries later."""


class Executor:
    def __init__(self, bus: EventBus, runner: BatchRunner, engines: EngineShelf, executor_id: str) -> None:
        self.bus = bus
        self.runner = runner
        self.engines = engines
        self.executor_id = executor_id

    async def on_message(self, message: Msg) -> None:
        try:
            command = RunBatch.model_validate_json(message.data)
        except ValidationError as error:
            raise PoisonMessage(f"not a RunBatch command: {error}") from error
        if command.executor_id != self.executor_id:
            raise PoisonMessage(f"command for executor {command.executor_id} reached {self.executor_id}")
        engine = await self.engines.get(command.model)
        if engine is None:
            raise PoisonMessage(f"model {command.model} is not served by executor {self.executor_id}")
        try:
            await self.runner.run(command, engine)
        except HOPELESS as error:
            raise PoisonMessage(f"{type(error).__name__}: {error}") from error

    async def on_poison(self, message: Msg, error: BaseException) -> None:
        try:
            command = RunBatch.model_validate_json(message.data)
        except ValidationError:
            log.error("dropping an undecodable run command on %s: %r", message.subject, error)
            return
        # The attempt failed, not the batch: the scheduler retries it elsewhere, up to its attempt limit.
        reason = f"attempt {command.attempt} on executor {self.executor_id} failed: {error}"
        await self.bus.publish(AttemptFailed(aggregate_id=command.batch_id, attempt=command.attempt,
                                             executor_id=self.executor_id, code="executor_error",
                                             reason=reason[:REASON_LIMIT]))

    async def on_finalize(self, message: Msg) -> None:
        try:
            command = FinalizeBatch.model_validate_json(message.data)
        except ValidationError as error:
            raise PoisonMessage(f"not a FinalizeBatch command: {error}") from error
        if command.executor_id != self.executor_id:
            raise PoisonMessage(f"finalize command for executor {command.executor_id} reached {self.executor_id}")
        batch_log = await read_batch_log(self.bus, command.batch_id)
        if batch_log.ended is not None:
            log.info("batch %s already ended (%s); nothing to finalize", command.batch_id, batch_log.ended)
            return
        live = batch_log.live_attempt()
        if live is not None:
            # The scheduler fences what runs before it sends this; a log read this early may not show it yet.
            running = self.runner.running.get(command.batch_id)
            if running is not None and command.reason in ("cancelled", "expired"):
                running.request_stop("cancelled" if command.reason == "cancelled" else "expired")
            raise FinalizeDeferred(f"attempt {live} of batch {command.batch_id} may still run")
        if command.reason == "completed":
            await self.bus.publish(BatchFinalizing(aggregate_id=command.batch_id, attempt=0))
        try:
            await self.runner.finalizer.finalize(command, command.reason, counts_as_committed(batch_log.announced),
                                                 code=command.code)
        except HOPELESS as error:
            raise PoisonMessage(f"{type(error).__name__}: {error}") from error

    async def on_finalize_poison(self, message: Msg, error: BaseException) -> None:
        """A finalize that cannot succeed ends its batch as failed, with the cause: it must not wait forever, nor
        hold a place in this executor's durable that other users' cancels and expiries need."""
        try:
            command = FinalizeBatch.model_validate_json(message.data)
        except ValidationError:
            log.error("dropping an undecodable finalize command on %s: %r", message.subject, error)
            return
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


def finalize_policy(ack_wait_s: float) -> ConsumerPolicy:
    """An executor's finalize durable: a command that keeps failing is given up (its batch fails) after bounded
    tries, and many may wait at once, so one user's batches cannot hold every place."""
    return ConsumerPolicy(ack_wait_s=ack_wait_s, max_deliver=FINALIZE_DELIVERIES, max_ack_pending=FINALIZE_PENDING)
