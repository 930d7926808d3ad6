"""Composition root of the executor: settings → engines, connection, dependencies → the executor's router on its
broker; it advertises and runs the batches assigned to it until stopped."""

import asyncio
import logging
import time
from pathlib import Path

import nats.errors

from contracts.commands import COMMAND_PROTOCOL, ExecutorRegistration
from contracts.events.executor import GUEST_ATTEMPTS, ExecutorAdvert
from services.executor.adapters.admission import keep_admitted
from services.executor.adapters.advert import OwnAdvert
from services.executor.adapters.artifacts import ArtifactResolver, default_cache_dir
from services.executor.adapters.broker import join
from services.executor.adapters.brokered_store import BrokeredObjectStore, http_pool
from services.executor.adapters.engines.shelf import EngineShelf
from services.executor.adapters.memory import device_memory, within_budget
from services.executor.adapters.objects import ObjectAccess
from services.executor.adapters.refusals import Refusals
from services.executor.adapters.registration import register, register_once
from services.executor.handlers import Executor, executor_router
from services.executor.heartbeat import Rejoin, heartbeat
from services.executor.retry import LineRetry
from services.executor.runner import BatchRunner
from services.executor.settings import ExecutorSettings
from services.runtime.nats.broker import stop_subscriber
from services.runtime.nats.bus import EventBus
from services.runtime.process import metrics
from services.runtime.process.tasks import cancel_and_join
from services.runtime.storage.catalogue import load_catalogue
from services.runtime.storage.objectstore import ObjectStore

log = logging.getLogger(__name__)

BROKER_STOP_S = 5.0


def advert_of(settings: ExecutorSettings, shelf: EngineShelf) -> ExecutorAdvert:
    versions = {engine.version for engine in shelf.loaded.values()}
    return ExecutorAdvert(
        executor_id=settings.executor_id, engine=settings.engine, engine_version=",".join(sorted(versions)),
        models=shelf.servable, loaded_models=sorted(shelf.loaded),
        devices=within_budget(device_memory(), settings.memory_budget_mb, shelf.loaded_bytes()),
        slots=sum(engine.slots for engine in shelf.loaded.values()), heartbeat_at=int(time.time() * 1000),
        parallel_attempts=settings.parallel_attempts, guest_attempts=GUEST_ATTEMPTS, protocol=COMMAND_PROTOCOL,
    )


async def open_shelf(settings: ExecutorSettings) -> EngineShelf:
    served = settings.served_models(load_catalogue(settings.connection.catalogue_path))
    cache = Path(settings.model_cache_dir) if settings.model_cache_dir else default_cache_dir()
    shelf = EngineShelf(settings.engine, settings.n_threads, served, ArtifactResolver(cache))
    try:
        await shelf.preload(settings.preload_models if settings.preload_models is not None else
                            [model.id for model in served if model.id in shelf.models][:1])
    except BaseException:
        await shelf.unload_all()  # a model loaded before the one that failed: its engine threads end with it
        raise
    return shelf


async def object_access(settings: ExecutorSettings, bus: EventBus) -> ObjectAccess:
    """Direct S3 where the executor has credentials; else presigned URLs for its own work, from the scheduler."""
    connection = settings.connection
    if not connection.s3_access_key:
        log.info("no S3 credentials: objects through presigned URLs from the scheduler")
        return BrokeredObjectStore(bus.nc, settings.executor_id, http_pool(connection.s3_tls_ca),
                                   settings.object_broker_wait_s)
    store = ObjectStore.from_settings(connection)
    await store.ensure_bucket()
    return store


def registration(settings: ExecutorSettings, advert: ExecutorAdvert) -> ExecutorRegistration:
    """What the scheduler is asked, and the durables it makes this executor."""
    return ExecutorRegistration(executor_id=settings.executor_id, worker_key=settings.worker_key, advert=advert,
                                ack_wait_s=settings.ack_wait_s, max_deliver=settings.max_deliver)


def rejoin_with(bus: EventBus, settings: ExecutorSettings) -> Rejoin | None:
    """How this executor registers again after a silence; None without a worker key (it never registered)."""
    if not settings.worker_key:
        return None

    async def rejoin(advert: ExecutorAdvert) -> bool:
        return await register_once(bus, registration(settings, advert)) is not None

    return rejoin


async def run_executor(settings: ExecutorSettings, stop: asyncio.Event) -> None:
    metrics.register("executor")
    engines = await open_shelf(settings)
    bus = None
    try:
        bus = await join(settings, stop)
        if bus is not None:
            await serve(settings, engines, bus, stop)
    finally:
        try:
            await engines.unload_all()  # first: an engine's own threads must end for the process to exit
        finally:
            if bus is not None:
                # A connection the broker keeps refusing (a revoked key) reconnects for ever: not waited for past this.
                await bus.broker.close_within(BROKER_STOP_S)


async def serve(settings: ExecutorSettings, engines: EngineShelf, bus: EventBus, stop: asyncio.Event) -> None:
    """Advertise, register, take commands until stopped (or the heartbeat fails); then withdraw the advert."""
    store = await object_access(settings, bus)
    engines.reach_objects(store)  # models whose weights are in the object store are fetched through it
    fleet = await OwnAdvert.open(bus, settings.executor_id, admitted=bool(settings.worker_key))
    advert = await fleet.advertise_first(lambda: advert_of(settings, engines), stop)
    if advert is None:
        return
    if settings.worker_key:
        refusals = Refusals(settings.executor_id, settings.join_retry_s, settings.join_retry_max_s,
                            settings.max_refusals)
        await register(bus, registration(settings, advert), stop, refusals)
    else:
        log.warning("no worker key (SHESHNAG_EXECUTOR_WORKER_KEY): the scheduler will not assign this executor "
                    "any batch; it only takes commands sent to it directly")
    retry = LineRetry(attempts=settings.line_attempts, base_delay_s=settings.line_retry_delay_s)
    runner = BatchRunner(bus, store, settings.executor_id, settings.chunk_lines, retry, settings.chunk_max_wait_s)
    router = executor_router(settings.executor_id, settings.ack_wait_s, settings.max_deliver,
                             settings.parallel_attempts)
    broker = bus.broker
    broker.include_router(router)
    broker.context.set_global(router.dependencies, Executor(bus, runner, engines, settings.executor_id))
    beating = asyncio.create_task(heartbeat(fleet, lambda: advert_of(settings, engines), settings.heartbeat_s,
                                            stop, rejoin_with(bus, settings)))
    # Only a broker that asks who connects (a worker key) ends an admission.
    renewing = asyncio.create_task(keep_admitted(bus.nc, settings.executor_id, stop) if settings.worker_key
                                   else stop.wait())
    stopping = asyncio.create_task(stop.wait())
    try:
        await broker.start()
        await asyncio.wait({stopping, beating}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.set()
        # No more commands: the attempts in hand get `stop_grace_s`, together, to commit (then they are cancelled,
        # unacked: redelivered and resumed). The connection stays open, for what is left to say.
        await asyncio.gather(*(stop_subscriber(subscriber) for subscriber in broker.subscribers))
        await cancel_and_join([beating, renewing])
        outcomes = await asyncio.gather(beating, renewing, stopping, return_exceptions=True)
        await runner.close()  # the batches' shared log feeds and the input copies' IO threads
    try:
        await fleet.withdraw()
    except (TimeoutError, nats.errors.Error) as error:  # the broker refuses or is gone: the advert goes stale
        log.warning("advert not withdrawn (%r); the scheduler sees it go stale", error)
    for outcome in outcomes:
        if isinstance(outcome, Exception):
            raise outcome
