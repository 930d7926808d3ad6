"""Joining the fleet: the executor proves itself to the leading scheduler with its worker key."""

import asyncio
import logging

import nats.errors

from contracts.commands import ExecutorRegistration, RegistrationAnswer
from contracts.events.executor import ExecutorAdvert
from contracts.subjects import FLEET_REGISTER
from services.runtime.bus import EventBus

log = logging.getLogger(__name__)

ANSWER_TIMEOUT_S = 2.0
RETRY_EVERY_S = 1.0


class RegistrationRefused(RuntimeError):
    """The scheduler refused the worker key: running on would never receive work."""


async def register(bus: EventBus, executor_id: str, worker_key: str, advert: ExecutorAdvert,
                   stop: asyncio.Event) -> str | None:
    """The worker key id once a scheduler admits this executor; None if stopped first. Retries while no
    scheduler answers (none leads yet, or a standby is taking over)."""
    request = ExecutorRegistration(executor_id=executor_id, worker_key=worker_key, advert=advert)
    waited = False
    while not stop.is_set():
        try:
            reply = await bus.nc.request(FLEET_REGISTER, request.model_dump_json().encode(), timeout=ANSWER_TIMEOUT_S)
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
            if not waited:
                log.info("waiting for a scheduler to register executor %s", executor_id)
                waited = True
            try:
                await asyncio.wait_for(stop.wait(), timeout=RETRY_EVERY_S)
            except TimeoutError:
                pass
            continue
        answer = RegistrationAnswer.model_validate_json(reply.data)
        if not answer.accepted:
            raise RegistrationRefused(f"executor {executor_id} was refused: {answer.reason}")
        log.info("executor %s registered (worker key %s)", executor_id, answer.worker_key_id)
        return answer.worker_key_id
    return None
