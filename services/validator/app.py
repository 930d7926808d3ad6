"""Composition root of the validator: connect, then consume created batches until stopped."""

import asyncio

from contracts.subjects import BATCH_CREATED, EVENTS_STREAM, VALIDATOR_DURABLE
from services.runtime.bus import ConsumerPolicy, EventBus
from services.runtime.catalogue import load_catalogue
from services.runtime.objectstore import ObjectStore
from services.validator.adapters.tokenizer import TokenizerCache
from services.validator.domain import Limits
from services.validator.handlers import Validator
from services.validator.settings import ValidatorSettings


async def run_validator(settings: ValidatorSettings, stop: asyncio.Event) -> None:
    connection = settings.connection
    bus = await EventBus.connect(connection.nats_url, "validator")
    store = ObjectStore.from_settings(connection)
    await store.ensure_bucket()
    validator = Validator(
        bus=bus,
        store=store,
        catalogue=load_catalogue(connection.catalogue_path),
        limits=Limits(max_lines=settings.max_lines, max_embedding_inputs=settings.max_embedding_inputs,
                      max_line_bytes=settings.max_line_bytes),
        max_published_per_code=settings.max_published_per_code,
        tokenizers=TokenizerCache() if settings.count_tokens else None,
    )
    if validator.tokenizers is not None:
        # Build every model's tokenizer before the first batch, not inside its validation.
        for model in validator.catalogue.models:
            await asyncio.to_thread(validator.tokenizers.get, model)
    try:
        await bus.consume(EVENTS_STREAM, VALIDATOR_DURABLE, [BATCH_CREATED], validator.on_message,
                          ConsumerPolicy(ack_wait_s=30, max_deliver=5), validator.on_poison, stop)
    finally:
        await bus.close()
