"""Composition root of the scheduler: settings → dependencies → the scheduler's router on a broker; each time it
wins the leader lease, it leads a term (the router's leader-only answers on that term's book) until stopped."""

import asyncio
import logging

import nats.errors

from services.authz.callout import open_admissions
from services.authz.relay import BareRelay
from services.runtime.nats.broker import CLOSE_S
from services.runtime.nats.bus import EventBus
from services.runtime.nats.leader import LeaderLease
from services.runtime.process import metrics
from services.runtime.storage.catalogue import load_catalogue
from services.scheduler.handlers import scheduler_router
from services.scheduler.objects import ObjectSigner
from services.scheduler.observe import leading
from services.scheduler.settings import SchedulerSettings
from services.scheduler.term import Term

log = logging.getLogger(__name__)


async def run_scheduler(settings: SchedulerSettings, stop: asyncio.Event) -> None:
    metrics.register("scheduler")
    leading(False)
    connection = settings.connection
    bus = await EventBus.connect(connection.nats_url, "scheduler", stop=stop)
    broker = bus.broker
    router = scheduler_router(callout=bool(connection.nats_callout_seed))
    broker.include_router(router)
    admissions = None
    try:
        admissions = await open_admissions(bus, connection)
        relaying = admissions.authority if admissions is not None else BareRelay(bus)
        broker.context.set_global(router.dependencies, relaying)
        catalogue = load_catalogue(connection.catalogue_path)
        signer = ObjectSigner.from_settings(connection, settings.object_url_endpoint, settings.object_url_expiry_s)
        lease = await LeaderLease.open(bus, settings.leader_ttl_s)
        await broker.start()
        try:
            while await lease.acquire(stop):
                leading(True)
                try:
                    term = await Term.open(bus, catalogue, signer, settings.policy())
                    async with router.leading(broker, term, bus) as folds:
                        await term.lead(lease, settings.tick_s, stop, folds)
                finally:
                    leading(False)
                await lease.release()  # a term that ended with the lease still held (its reader failed) gives it up
        finally:
            await lease.release()
    finally:
        if admissions is not None:
            try:
                await asyncio.wait_for(admissions.close(), CLOSE_S)
            except (TimeoutError, nats.errors.Error) as error:  # the broker gone: nothing left to unsubscribe from
                log.warning("the auth callout's disconnector did not close (%r)", error)
        await broker.close_within()
