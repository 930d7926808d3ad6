"""Thin handlers: a RunBatch command in, a batch run, its facts out; a hopeless command fails the batch.
A FinalizeBatch command ends a batch that runs nowhere, or hands it to the attempt running it here."""

import logging

from nats.aio.msg import Msg
from pydantic import ValidationError

from contracts.commands import FinalizeBatch, RunBatch
from contracts.events.batch import AttemptFailed, BatchFinalizing
from services.executor.adapters.engines.shelf import EngineShelf
from services.executor.adapters.watch import read_batch_log
from services.executor.attempts import counts_as_committed
from services.executor.domain import InvalidInputLine
from services.executor.runner import BatchRunner
from services.runtime.bus import EventBus, PoisonMessage

log = logging.getLogger(__name__)

REASON_LIMIT = 1000


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
        except InvalidInputLine as error:
            raise PoisonMessage(str(error)) from error

    async def on_poison(self, message: Msg, error: BaseException) -> None:
        try:
            command = RunBatch.model_validate_json(message.data)
        except ValidationError:
            log.error("dropping an undecodable run command on %s: %r", message.subject, error)
            return
        # The attempt failed, not the batch: the scheduler retries it elsewhere, up to its attempt limit.
        reason = f"attempt {command.attempt} on executor {self.executor_id} failed: {error}"
        await self.bus.publish(AttemptFailed(aggregate_id=command.batch_id, correlation_id=command.batch_id,
                                             attempt=command.attempt, executor_id=self.executor_id,
                                             code="executor_error", reason=reason[:REASON_LIMIT]))

    async def on_finalize(self, message: Msg) -> None:
        try:
            command = FinalizeBatch.model_validate_json(message.data)
        except ValidationError as error:
            raise PoisonMessage(f"not a FinalizeBatch command: {error}") from error
        running = self.runner.running.get(command.batch_id)
        if running is not None and command.reason != "completed":
            running.request_stop(command.reason)
            raise FinalizeDeferred(f"batch {command.batch_id} runs here; its attempt winds down first")
        batch_log = await read_batch_log(self.bus, command.batch_id)
        if batch_log.ended is not None:
            log.info("batch %s already ended (%s); nothing to finalize", command.batch_id, batch_log.ended)
            return
        live = batch_log.live_attempt()
        if live is not None:
            raise FinalizeDeferred(f"attempt {live} of batch {command.batch_id} may still run")
        if command.reason == "completed":
            await self.bus.publish(BatchFinalizing(aggregate_id=command.batch_id, correlation_id=command.batch_id,
                                                   attempt=0))
        try:
            await self.runner.finalizer.finalize(command, command.reason, counts_as_committed(batch_log.announced),
                                                 code=command.code)
        except InvalidInputLine as error:
            raise PoisonMessage(str(error)) from error

    async def on_finalize_poison(self, message: Msg, error: BaseException) -> None:
        log.error("a finalize command on %s cannot be handled: %r", message.subject, error)
