"""The executor's NATS connection: as its executor id with its worker key, which the broker's auth callout
turns into the permissions of `contracts/permissions.py` (its facts then go through the scheduler's fact desk)."""

import asyncio
import contextlib
import logging

import nats.errors

from contracts.permissions import executor_inbox
from services.executor.adapters.desk import DeskBus, FactDesk
from services.executor.settings import ExecutorSettings
from services.runtime.bus import Credentials, EventBus

log = logging.getLogger(__name__)

RETRY_EVERY_S = 1.0
REFUSAL_LOG_EVERY = 30
"""Refusals between two warnings: a refused executor keeps trying, quietly."""


def credentials(settings: ExecutorSettings) -> Credentials | None:
    """None without a worker key: such an executor can join only a broker that asks nobody who they are."""
    if not settings.worker_key:
        return None
    return Credentials(settings.executor_id, settings.worker_key, executor_inbox(settings.executor_id))


def _refused(error: Exception) -> bool:
    return "authorization violation" in str(error).lower()


async def connect(settings: ExecutorSettings, stop: asyncio.Event) -> EventBus | None:
    """The connection, or None if stopped first. A refusal is retried: a scheduler that answers for the broker
    may still be starting, or the ledger not yet have folded a new worker key."""
    refusals = 0
    joining = credentials(settings)
    while not stop.is_set():
        try:
            if joining is None:
                return await EventBus.connect(settings.connection.nats_url, f"executor-{settings.executor_id}")
            # Admitted by worker key, it may not touch the event log: its facts and reads go through the desk.
            bus = await DeskBus.connect(settings.connection.nats_url, f"executor-{settings.executor_id}", joining)
            bus.desk = FactDesk(bus.nc, settings.executor_id, settings.object_broker_wait_s)
            return bus
        except nats.errors.Error as error:
            if not _refused(error):
                raise
        if refusals % REFUSAL_LOG_EVERY == 0:
            log.warning("NATS refused executor %s (its worker key is unknown, revoked or not a worker key, or no "
                        "scheduler answers for the broker yet); retrying", settings.executor_id)
        refusals += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), RETRY_EVERY_S)
    return None
