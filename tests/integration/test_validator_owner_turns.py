"""Owners take turns at the validator (`fair_turns.py`): a batch created behind another tenant's queue of large files
is validated after the one under way, not after every one queued before it."""

import asyncio

import orjson

from contracts.events.batch import BatchValidated
from contracts.ids import new_batch_id, new_file_id
from contracts.subjects import EVENTS_STREAM, event_subject, input_object_key
from services.runtime.nats.bus import EventBus
from services.runtime.process.settings import ConnectionSettings
from services.runtime.storage.objectstore import ObjectStore
from services.validator.app import run_validator
from services.validator.settings import ValidatorSettings
from tests.factories import batch_created
from tests.support import batch_facts

LARGE_FILES = 5
LINES = 3000


def file_of(lines: int) -> bytes:
    return b"".join(orjson.dumps({"custom_id": f"c{n}", "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": "smollm2", "messages": [{"role": "user", "content": f"Say {n}."}]}}) + b"\n" for n in range(lines))


async def create(bus: EventBus, store: ObjectStore, owner_key_id: str, content: bytes) -> str:
    file_id, batch_id = new_file_id(), new_batch_id()
    await store.put_bytes(input_object_key(file_id), content)
    await bus.publish(batch_created(batch_id, owner_key_id, input_object_key(file_id), created_at=0,
                                    expires_at=86400))
    return batch_id


async def validated_at(bus: EventBus, batch_id: str) -> int:
    """The stream sequence of the batch's `validated` fact, once stated."""
    await batch_facts(bus, batch_id, lambda fact: isinstance(fact, BatchValidated), timeout_s=240)
    stated = await bus.js.get_last_msg(EVENTS_STREAM, event_subject("batch", batch_id, BatchValidated.name))
    assert stated.seq is not None
    return stated.seq


async def test_another_owners_batch_is_validated_after_the_one_under_way_not_after_the_whole_queue(
        bus: EventBus, object_store: ObjectStore, connection: ConnectionSettings) -> None:
    large = file_of(LINES)
    queued = [await create(bus, object_store, "key_heavy", large) for _ in range(LARGE_FILES)]
    small = await create(bus, object_store, "key_light", file_of(1))
    stop = asyncio.Event()  # started once all are in the log: it takes them all while the first is checked
    validator = asyncio.create_task(run_validator(ValidatorSettings(connection=connection, validations_at_once=1),
                                                  stop))
    try:
        small_at = await validated_at(bus, small)
        heavy_at = [await validated_at(bus, batch_id) for batch_id in queued]
    finally:
        stop.set()
        await asyncio.wait_for(validator, 30)
    assert heavy_at[0] < small_at < heavy_at[1], (heavy_at, small_at)
    assert heavy_at == sorted(heavy_at), "one owner's batches keep their order"
