"""A batch whose check the validator was killed in again and again is given up (failed) on its `MAX_STARTS`th start,
not handed out for ever; a batch that merely waited through restarts is not counted, and checks as ever."""

import asyncio

from contracts.events.batch import BatchFailed, BatchValidated
from contracts.subjects import VALIDATIONS_BUCKET
from services.runtime.nats.bus import EventBus
from services.runtime.nats.kv import open_bucket
from services.runtime.process.settings import ConnectionSettings
from services.runtime.storage.objectstore import ObjectStore
from services.validator.app import run_validator
from services.validator.handlers import MAX_STARTS
from services.validator.settings import ValidatorSettings
from tests.integration.test_validator_owner_turns import create, file_of
from tests.support import batch_facts


def ended(fact: object) -> bool:
    return isinstance(fact, BatchValidated | BatchFailed)


async def test_a_batch_the_validator_stopped_in_each_time_is_failed_and_one_started_once_is_checked(
        bus: EventBus, object_store: ObjectStore, connection: ConnectionSettings) -> None:
    stopped_in = await create(bus, object_store, "key_starts", file_of(2))
    fresh = await create(bus, object_store, "key_starts_other", file_of(2))
    starts = await open_bucket(bus, VALIDATIONS_BUCKET)
    await starts.put(stopped_in, str(MAX_STARTS).encode())  # as if begun that often, each ended by a kill
    stop = asyncio.Event()
    validator = asyncio.create_task(run_validator(ValidatorSettings(connection=connection), stop))
    try:
        given_up = (await batch_facts(bus, stopped_in, ended))[-1]
        checked = (await batch_facts(bus, fresh, ended))[-1]
    finally:
        stop.set()
        await asyncio.wait_for(validator, 30)
    assert isinstance(given_up, BatchFailed) and given_up.code == "validation_error", given_up
    assert f"started {MAX_STARTS} times" in given_up.reason
    assert isinstance(checked, BatchValidated)
    assert (await starts.get(fresh)).value == b"1"
