"""Thin handlers: a validated batch in, an assignment and a run command to one executor out."""

import logging
import time
from dataclasses import dataclass

from nats.aio.msg import Msg

from contracts.catalogue import Catalogue
from contracts.commands import RunBatch
from contracts.events.batch import BatchAssigned, BatchFailed, BatchValidated
from contracts.events.registry import decode_event
from contracts.ids import derived_id
from services.runtime.bus import EventBus, PoisonMessage
from services.runtime.fleet import Fleet
from services.scheduler.domain import choose_executor, why_unassignable

log = logging.getLogger(__name__)

FIRST_ATTEMPT = 1


class NoExecutorYet(Exception):
    """Retried later: the batch stays validated until an executor that fits comes online."""


@dataclass
class Scheduler:
    bus: EventBus
    fleet: Fleet
    catalogue: Catalogue

    async def on_message(self, message: Msg) -> None:
        event = decode_event(message.data)
        if not isinstance(event, BatchValidated):
            raise PoisonMessage(f"scheduler got {event.type}")
        await self.assign(event)

    async def on_poison(self, message: Msg, error: BaseException) -> None:
        event = decode_event(message.data)
        await self.bus.publish(BatchFailed(aggregate_id=event.aggregate_id, code="scheduling_error",
                                           reason=f"The batch could not be scheduled: {error}",
                                           causation_id=event.event_id))

    async def assign(self, validated: BatchValidated) -> None:
        model = self.catalogue.resolve(validated.model)
        if model is None:
            raise PoisonMessage(f"model {validated.model} left the catalogue")
        adverts = await self.fleet.adverts()
        now_ms = int(time.time() * 1000)
        chosen = choose_executor(model, adverts, now_ms)
        if chosen is None:
            raise NoExecutorYet(why_unassignable(model, adverts, now_ms))
        lease_token = derived_id("lease_", validated.aggregate_id, str(FIRST_ATTEMPT))
        await self.bus.publish(BatchAssigned(
            aggregate_id=validated.aggregate_id, executor_id=chosen.executor_id, attempt=FIRST_ATTEMPT,
            lease_token=lease_token, causation_id=validated.event_id, correlation_id=validated.aggregate_id))
        await self.bus.send_run(RunBatch(
            batch_id=validated.aggregate_id, executor_id=chosen.executor_id, attempt=FIRST_ATTEMPT,
            lease_token=lease_token, owner_key_id=validated.owner_key_id, model=model.id,
            endpoint=validated.endpoint, input_object_key=validated.input_object_key,
            total_lines=validated.total_lines))
        log.info("batch %s assigned to %s", validated.aggregate_id, chosen.executor_id)
