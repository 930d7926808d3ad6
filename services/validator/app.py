"""Composition root of the validator: settings → dependencies → the validator's router on a broker, until stopped."""

import asyncio
import os

from services.runtime.nats.bus import EventBus
from services.runtime.process import metrics
from services.runtime.storage.catalogue import load_catalogue
from services.runtime.storage.objectstore import ObjectStore
from services.validator.adapters.check_pool import CheckPool
from services.validator.adapters.starts import ValidationStarts
from services.validator.adapters.tokenizer import TokenizerCache
from services.validator.domain import Limits
from services.validator.fair_turns import FairTurns
from services.validator.handlers import Validator, validator_router
from services.validator.settings import ValidatorSettings


async def run_validator(settings: ValidatorSettings, stop: asyncio.Event) -> None:
    metrics.register("validator")
    connection = settings.connection
    bus = await EventBus.connect(connection.nats_url, "validator", stop=stop)
    broker = bus.broker
    router = validator_router()
    broker.include_router(router)
    pool: CheckPool | None = None
    try:
        store = ObjectStore.from_settings(connection)
        await store.ensure_bucket()
        catalogue = load_catalogue(connection.catalogue_path)
        processes = settings.worker_processes(os.cpu_count())
        pool = CheckPool(catalogue, processes, settings.count_tokens) if processes else None
        limits = Limits(max_lines=settings.max_lines, max_embedding_inputs=settings.max_embedding_inputs,
                        max_line_bytes=settings.max_line_bytes, inherit_line_model=settings.inherit_line_model)
        tokenizers = TokenizerCache() if settings.count_tokens else None
        validator = Validator(bus, store, catalogue, limits, settings.max_published_per_code, tokenizers, pool,
                              FairTurns(settings.validations_at_once), await ValidationStarts.open(bus))
        if pool is not None:
            await asyncio.to_thread(pool.warm_up)
        if tokenizers is not None:
            # Build every model's tokenizer before the first batch, not inside its validation.
            for model in catalogue.models:
                await asyncio.to_thread(tokenizers.get, model)
        broker.context.set_global(router.dependencies, validator)
        await broker.start()
        await stop.wait()
    finally:
        await broker.close_within()
        if pool is not None:
            pool.close()
