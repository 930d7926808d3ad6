"""Joining the fleet: the executor proves itself to the leading scheduler with its worker key."""

import asyncio
import contextlib
import logging

import nats.errors

from contracts.commands import ExecutorRegistration, RegistrationAnswer
from contracts.subjects import fleet_registrations
from services.executor.adapters.refusals import Refusals
from services.runtime.nats.bus import EventBus

log = logging.getLogger(__name__)

ANSWER_TIMEOUT_S = 15.0
"""Longer than the slowest answer (the scheduler makes the executor's durables and states the registration, one
executor at a time): one given up on would still be stored, and the next ask stored again."""
RETRY_EVERY_S = 1.0


class RegistrationRefused(RuntimeError):
    """The scheduler refused the worker key: running on would never receive work."""


async def register_once(bus: EventBus, request: ExecutorRegistration) -> RegistrationAnswer | None:
    """A scheduler's acceptance of this executor (it has made the executor's durables then); None when none answered;
    RegistrationRefused when one refused."""
    executor_id = request.executor_id
    try:
        reply = await bus.nc.request(fleet_registrations(executor_id), request.model_dump_json().encode(),
                                     timeout=ANSWER_TIMEOUT_S)
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
        return None
    answer = RegistrationAnswer.model_validate_json(reply.data)
    if answer.retry:
        return None
    if not answer.accepted:
        raise RegistrationRefused(f"executor {executor_id} was refused: {answer.reason}")
    log.info("executor %s registered (worker key %s)", executor_id, answer.worker_key_id)
    return answer


async def register(bus: EventBus, request: ExecutorRegistration, stop: asyncio.Event,
                   refusals: Refusals) -> str | None:
    """The worker key id once a scheduler admits this executor (refusals back off); None if stopped first."""
    waited = False
    while not stop.is_set():
        try:
            answer = await register_once(bus, request)
        except RegistrationRefused as refused:
            await refusals.back_off(str(refused), stop)
            continue
        if answer is not None:
            return answer.worker_key_id
        if not waited:
            log.info("waiting for a scheduler to register executor %s", request.executor_id)
            waited = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=RETRY_EVERY_S)
    return None
