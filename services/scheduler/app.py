"""Composition root of the scheduler: win the leader lease, rebuild the book from the log, act every tick."""

import asyncio
import contextlib
import logging

from services.authz.callout import admit_executors
from services.runtime.bus import EventBus
from services.runtime.catalogue import load_catalogue
from services.runtime.fleet import Fleet
from services.runtime.readmodel import ReadModel
from services.scheduler.handlers import Scheduler
from services.scheduler.leader import LeaderLease
from services.scheduler.objects import ObjectSigner
from services.scheduler.settings import SchedulerSettings

log = logging.getLogger(__name__)


async def run_scheduler(settings: SchedulerSettings, stop: asyncio.Event) -> None:
    connection = settings.connection
    bus = await EventBus.connect(connection.nats_url, "scheduler")
    admissions = await admit_executors(bus, connection)  # leader or standby: the broker asks any scheduler
    catalogue = load_catalogue(connection.catalogue_path)
    lease = await LeaderLease.open(bus, settings.leader_ttl_s)
    signer = ObjectSigner.from_settings(connection, settings.object_url_endpoint, settings.object_url_expiry_s)
    try:
        while await lease.acquire(stop):
            scheduler = Scheduler(bus, await Fleet.open(bus), catalogue, await ReadModel.open(bus),
                                  settings.policy())
            await lead(scheduler, lease, settings, stop, signer)
    finally:
        await lease.release()
        if admissions is not None:
            await admissions.close()
        await bus.close()


async def lead(scheduler: Scheduler, lease: LeaderLease, settings: SchedulerSettings, stop: asyncio.Event,
               signer: ObjectSigner) -> None:
    """One term as leader: a fresh book from the whole log, then decisions until stopped or the lease is lost."""
    term_over = asyncio.Event()
    reader = asyncio.create_task(scheduler.follow(term_over))
    registrations = await scheduler.answer_registrations()
    object_requests = await scheduler.answer_object_requests(signer)
    desk = await scheduler.answer_fact_desk()
    keeper = asyncio.create_task(lease.keep(stop))
    resent = False
    try:
        while not stop.is_set() and not keeper.done():
            if scheduler.caught_up.is_set():
                if not resent:
                    await scheduler.resend_runs()
                    resent = True
                await scheduler.tick()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=settings.tick_s)
    finally:
        keeper.cancel()
        term_over.set()
        await registrations.unsubscribe()
        await object_requests.unsubscribe()
        for subscription in desk:
            await subscription.unsubscribe()
        await asyncio.wait_for(asyncio.gather(reader, return_exceptions=True), timeout=10)
    if not stop.is_set():
        log.warning("leadership lost; back to standby")
