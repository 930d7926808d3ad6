"""Composition root of the executor: load the engines, advertise, run assigned batches until stopped."""

import asyncio
import logging
import time

from contracts.events.executor import ExecutorAdvert
from contracts.subjects import (
    WORK_STREAM,
    executor_durable,
    executor_finalize_durable,
    finalize_command,
    run_command,
)
from services.executor.adapters import broker
from services.executor.adapters.admission import keep_admitted
from services.executor.adapters.brokered_store import BrokeredObjectStore, http_pool
from services.executor.adapters.engines.shelf import EngineShelf
from services.executor.adapters.memory import device_memory, within_budget
from services.executor.adapters.objects import ObjectAccess
from services.executor.adapters.registration import register, register_once
from services.executor.handlers import Executor, finalize_policy
from services.executor.heartbeat import Rejoin, heartbeat
from services.executor.retry import LineRetry
from services.executor.runner import BatchRunner
from services.executor.settings import ExecutorSettings
from services.runtime.bus import ConsumerPolicy, EventBus
from services.runtime.catalogue import load_catalogue
from services.runtime.fleet import Fleet
from services.runtime.objectstore import ObjectStore

log = logging.getLogger(__name__)


def advert_of(settings: ExecutorSettings, shelf: EngineShelf) -> ExecutorAdvert:
    versions = {engine.version for engine in shelf.loaded.values()}
    return ExecutorAdvert(
        executor_id=settings.executor_id, engine=settings.engine, engine_version=",".join(sorted(versions)),
        models=shelf.servable, loaded_models=sorted(shelf.loaded),
        devices=within_budget(device_memory(), settings.memory_budget_mb, shelf.loaded_bytes()),
        slots=sum(engine.slots for engine in shelf.loaded.values()), heartbeat_at=int(time.time() * 1000),
    )


async def open_shelf(settings: ExecutorSettings) -> EngineShelf:
    served = settings.served_models(load_catalogue(settings.connection.catalogue_path))
    shelf = EngineShelf(settings.engine, settings.n_threads, served)
    await shelf.preload(settings.preload_models if settings.preload_models is not None else [served[0].id])
    return shelf


async def object_access(settings: ExecutorSettings, bus: EventBus) -> ObjectAccess:
    """Direct S3 where the deployment trusts the executor with credentials; else presigned URLs for its own work
    only, from the leading scheduler (a provider's executor gets no credentials)."""
    connection = settings.connection
    if not connection.s3_access_key:
        log.info("no S3 credentials: objects through presigned URLs from the scheduler")
        return BrokeredObjectStore(bus.nc, settings.executor_id, http_pool(), settings.object_broker_wait_s)
    store = ObjectStore.from_settings(connection)
    await store.ensure_bucket()
    return store


def rejoin_with(bus: EventBus, settings: ExecutorSettings) -> Rejoin | None:
    """How this executor registers again after a silence; None without a worker key (it never registered)."""
    if not settings.worker_key:
        return None
    worker_key = settings.worker_key

    async def rejoin(advert: ExecutorAdvert) -> bool:
        return await register_once(bus, settings.executor_id, worker_key, advert) is not None

    return rejoin


async def run_executor(settings: ExecutorSettings, stop: asyncio.Event) -> None:
    engines = await open_shelf(settings)
    bus = await broker.connect(settings, stop)
    if bus is None:
        await engines.unload_all()
        return
    try:
        store = await object_access(settings, bus)
        fleet = await Fleet.open(bus, scans=False)
        advert = advert_of(settings, engines)
        await fleet.advertise(advert)
        if settings.worker_key:
            await register(bus, settings.executor_id, settings.worker_key, advert, stop)
        else:
            log.warning("no worker key (SHESHNAG_EXECUTOR_WORKER_KEY): the scheduler will not assign this executor "
                        "any batch; it only takes commands sent to it directly")
        retry = LineRetry(attempts=settings.line_attempts, base_delay_s=settings.line_retry_delay_s)
        runner = BatchRunner(bus, store, settings.executor_id, settings.chunk_lines, retry)
        executor = Executor(bus, runner, engines, settings.executor_id)
        # One batch at a time (the consume loop is sequential; the engine's slots are the concurrency, inside
        # the batch). More than one may be pending: a command a crashed predecessor held must not block the
        # retry the scheduler sends after fencing it.
        policy = ConsumerPolicy(ack_wait_s=settings.ack_wait_s, max_deliver=settings.max_deliver,
                                max_ack_pending=4)
        beating = asyncio.create_task(heartbeat(fleet, lambda: advert_of(settings, engines), settings.heartbeat_s,
                                                stop, rejoin_with(bus, settings)))
        renewing = asyncio.create_task(keep_admitted(bus.nc, stop))
        consuming = asyncio.create_task(bus.consume(
            WORK_STREAM, executor_durable(settings.executor_id), [run_command(settings.executor_id)],
            executor.on_message, policy, executor.on_poison, stop))
        # The finalize commands of the batches the scheduler chose this executor for; many may wait on a running
        # attempt at once.
        finalizing = asyncio.create_task(bus.consume(
            WORK_STREAM, executor_finalize_durable(settings.executor_id), [finalize_command(settings.executor_id)],
            executor.on_finalize,
            finalize_policy(settings.ack_wait_s),
            executor.on_finalize_poison, stop))
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait({stopping, consuming, finalizing, beating}, return_when=asyncio.FIRST_COMPLETED)
        stop.set()
        # The batch in hand gets a moment to commit; whatever is left is redelivered and resumed.
        await asyncio.wait({consuming, finalizing}, timeout=settings.stop_grace_s)
        for task in (consuming, finalizing, beating, renewing):
            task.cancel()
        outcomes = await asyncio.gather(consuming, finalizing, beating, renewing, stopping, return_exceptions=True)
        await fleet.withdraw(settings.executor_id)
        for outcome in outcomes:
            if isinstance(outcome, Exception):
                raise outcome
    finally:
        await bus.close()
        await engines.unload_all()
