"""Admitting executors to the fleet: a worker key is required; user and admin keys are refused."""

import logging
from dataclasses import dataclass

from nats.aio.msg import Msg

from contracts.commands import ExecutorRegistration, RegistrationAnswer
from contracts.events.executor import ExecutorRegistered
from contracts.ids import hash_api_key
from contracts.readmodel import ApiKeyRecord
from contracts.subjects import FLEET_REGISTER
from services.runtime.bus import EventBus
from services.runtime.delivery import Answer
from services.runtime.readmodel import ReadModel
from services.scheduler.book import Book

log = logging.getLogger(__name__)

REGISTRATIONS = Answer(FLEET_REGISTER, ExecutorRegistration,
                       lambda why: RegistrationAnswer(accepted=False, reason=f"Malformed registration: {why}"))


def worker_key_refusal(record: ApiKeyRecord | None) -> str | None:
    """Why a key may not join the fleet (unknown, revoked, not a worker key); None for a live worker key.
    Registration and the broker's admission of an executor's connection ask the same."""
    if record is None:
        return "Unknown worker key."
    if record.revoked:
        return f"Worker key {record.key_id} was revoked."
    if record.role != "worker":
        return f"A {record.role} key cannot register an executor; ask an operator for a worker key."
    return None


@dataclass
class Registrar:
    bus: EventBus
    read_model: ReadModel
    book: Book

    async def answer(self, request: ExecutorRegistration) -> RegistrationAnswer:
        record = await self.read_model.get_api_key(hash_api_key(request.worker_key))
        refusal = worker_key_refusal(record)
        if refusal is not None or record is None:
            return RegistrationAnswer(accepted=False, reason=refusal)
        registered = ExecutorRegistered(aggregate_id=request.executor_id, advert=request.advert,
                                        started_at=request.advert.heartbeat_at, worker_key_id=record.key_id,
                                        provider_id=record.provider_id)
        await self.bus.publish(registered)
        self.book.apply(registered)
        log.info("executor %s registered with worker key %s", request.executor_id, record.key_id)
        return RegistrationAnswer(accepted=True, worker_key_id=record.key_id)

    async def on_request(self, message: Msg) -> None:
        """A bare connection's callback (a test's registrar, no broker); the scheduler answers through its router."""
        await REGISTRATIONS.respond(message, self.answer)
