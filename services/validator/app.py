"""Composition root of the validator: settings → dependencies → the validator's router on a broker, until stopped."""

import asyncio

from services.runtime.broker import open_bus, service_broker
from services.runtime.catalogue import load_catalogue
from services.runtime.objectstore import ObjectStore
from services.validator.adapters.tokenizer import TokenizerCache
from services.validator.domain import Limits
from services.validator.handlers import Validator, validator_router
from services.validator.settings import ValidatorSettings


async def run_validator(settings: ValidatorSettings, stop: asyncio.Event) -> None:
    connection = settings.connection
    broker = service_broker(connection.nats_url, "validator", stop=stop)
    router = validator_router()
    broker.include_router(router)
    bus = await open_bus(broker, "validator")
    try:
        store = ObjectStore.from_settings(connection)
        await store.ensure_bucket()
        validator = Validator(
            bus=bus,
            store=store,
            catalogue=load_catalogue(connection.catalogue_path),
            limits=Limits(max_lines=settings.max_lines, max_embedding_inputs=settings.max_embedding_inputs,
                          max_line_bytes=settings.max_line_bytes, inherit_line_model=settings.inherit_line_model),
            max_published_per_code=settings.max_published_per_code,
            tokenizers=TokenizerCache() if settings.count_tokens else None,
        )
        if validator.tokenizers is not None:
            # Build every model's tokenizer before the first batch, not inside its validation.
            for model in validator.catalogue.models:
                await asyncio.to_thread(validator.tokenizers.get, model)
        broker.context.set_global(router.dependencies, validator)
        await broker.start()
        await stop.wait()
    finally:
        await broker.stop()
