"""The validator against the real broker and S3: bad lines become events, then one verdict."""

import asyncio
from collections.abc import AsyncIterator

import orjson
import pytest

from contracts.events.batch import BatchCreated, BatchValidated, BatchValidationFailed, LineRejected
from contracts.ids import new_batch_id, new_file_id
from contracts.subjects import input_object_key
from services.runtime.bus import EventBus
from services.runtime.objectstore import ObjectStore
from services.runtime.settings import ConnectionSettings
from services.validator.app import run_validator
from services.validator.settings import ValidatorSettings
from tests.support import batch_facts

CHAT = "/v1/chat/completions"


def request_line(custom_id: str, model: str = "smollm2") -> bytes:
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": CHAT,
                         "body": {"model": model, "messages": [{"role": "user", "content": "hi"}]}})


@pytest.fixture
async def validator(connection: ConnectionSettings) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task(run_validator(ValidatorSettings(connection=connection), stop))
    yield
    stop.set()
    await asyncio.wait_for(task, 10)


async def submit(bus: EventBus, store: ObjectStore, content: bytes) -> str:
    file_id, batch_id = new_file_id(), new_batch_id()
    await store.put_bytes(input_object_key(file_id), content)
    await bus.publish(BatchCreated(aggregate_id=batch_id, owner_key_id="key_test", input_file_id=file_id,
                                   input_object_key=input_object_key(file_id), endpoint=CHAT,
                                   completion_window="24h", created_at=0, expires_at=86400))
    return batch_id


def is_verdict(event: object) -> bool:
    return isinstance(event, BatchValidated | BatchValidationFailed)


async def test_a_good_file_is_validated_with_its_line_count_and_pinned_model(
        bus: EventBus, object_store: ObjectStore, validator: None) -> None:
    content = b"\n".join([request_line("a"), b"", request_line("b")]) + b"\n"
    batch_id = await submit(bus, object_store, content)
    facts = await batch_facts(bus, batch_id, is_verdict)
    verdict = facts[-1]
    assert isinstance(verdict, BatchValidated)
    assert verdict.total_lines == 2 and verdict.model == "smollm2-135m-instruct-q4_1"


async def test_every_bad_line_is_published_with_its_line_number_before_the_failure(
        bus: EventBus, object_store: ObjectStore, validator: None) -> None:
    content = b"\n".join([request_line("a"), b"{oops", request_line("a"), request_line("c", model="nope")])
    batch_id = await submit(bus, object_store, content)
    facts = await batch_facts(bus, batch_id, is_verdict)
    rejected = [(f.line, f.code) for f in facts if isinstance(f, LineRejected)]
    assert rejected == [(2, "invalid_json"), (3, "duplicate_custom_id"), (4, "unsupported_model")]
    verdict = facts[-1]
    assert isinstance(verdict, BatchValidationFailed)
    assert verdict.error_count == 3 and verdict.total_lines == 4
