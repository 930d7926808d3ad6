"""The validator against the real broker and S3: bad lines become events, then one verdict."""

import asyncio
from collections.abc import AsyncIterator

import orjson
import pytest

from contracts.api.output_line import OutputLine
from contracts.events.batch import BatchValidated, BatchValidationFailed, LineRejected
from contracts.events.file import FileStored
from contracts.events.registry import decode_event
from contracts.ids import batch_request_id, error_file_id, new_batch_id, new_file_id
from contracts.subjects import EVENTS_STREAM, event_subject, input_object_key
from services.runtime.nats.bus import EventBus
from services.runtime.process.settings import ConnectionSettings
from services.runtime.storage.objectstore import ObjectStore
from services.validator.app import run_validator
from services.validator.settings import ValidatorSettings
from tests.factories import batch_created
from tests.support import batch_facts

CHAT = "/v1/chat/completions"


def request_line(custom_id: str, model: str = "smollm2") -> bytes:
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": CHAT,
                         "body": {"model": model, "messages": [{"role": "user", "content": "hi"}]}})


MAX_LINES = 40
"""The line limit of the validator under test, small enough to pass it cheaply."""
PUBLISHED_PER_CODE = 5


@pytest.fixture(scope="module")
async def validator(connection: ConnectionSettings) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task(run_validator(ValidatorSettings(
        connection=connection, max_lines=MAX_LINES, max_published_per_code=PUBLISHED_PER_CODE), stop))
    yield
    stop.set()
    await asyncio.wait_for(task, 10)


async def submit(bus: EventBus, store: ObjectStore, content: bytes, allow_partial: bool = False) -> str:
    file_id, batch_id = new_file_id(), new_batch_id()
    await store.put_bytes(input_object_key(file_id), content)
    await bus.publish(batch_created(batch_id, "key_test", input_object_key(file_id), created_at=0, expires_at=86400,
                                    allow_partial=allow_partial))
    return batch_id


async def error_lines(bus: EventBus, store: ObjectStore, verdict: BatchValidationFailed) -> list[OutputLine]:
    """The failed batch's error file, once its `file.stored` fact names it as the batch owner's."""
    assert verdict.error_file_id == error_file_id(verdict.aggregate_id)
    message = await bus.js.get_last_msg(EVENTS_STREAM, event_subject("file", verdict.error_file_id, "stored"))
    assert message.data is not None
    stored = decode_event(message.data)
    assert isinstance(stored, FileStored) and stored.owner_key_id == "key_test"
    data = await store.get_bytes(stored.object_key)
    assert (stored.bytes, stored.line_count, stored.purpose) == (len(data), verdict.total_lines, "batch_output")
    return [OutputLine.model_validate_json(raw) for raw in data.splitlines()]


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


async def test_allow_partial_reports_the_true_error_totals_past_the_published_errors(
        bus: EventBus, object_store: ObjectStore, validator: None) -> None:
    content = b"\n".join([request_line("a"), *[b"{oops"] * 30, request_line("b")])
    batch_id = await submit(bus, object_store, content, allow_partial=True)
    facts = await batch_facts(bus, batch_id, is_verdict)
    assert [f.line for f in facts if isinstance(f, LineRejected)] == [2, 3, 4, 5, 6]
    verdict = facts[-1]
    assert isinstance(verdict, BatchValidated)
    assert (verdict.rejected_lines, verdict.error_count, verdict.counts_by_code) == (30, 30, {"invalid_json": 30})


async def test_a_failed_batch_has_an_error_file_with_every_input_line_and_every_error_of_each(
        bus: EventBus, object_store: ObjectStore, validator: None) -> None:
    two_errors = orjson.dumps({"custom_id": "b", "method": "GET", "url": CHAT, "extra": 1,
                               "body": {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}})
    content = b"\n".join([request_line("a"), two_errors, b"", request_line("a"), b"{oops", request_line("c")])
    batch_id = await submit(bus, object_store, content)
    verdict = (await batch_facts(bus, batch_id, is_verdict))[-1]
    assert isinstance(verdict, BatchValidationFailed)
    assert (verdict.total_lines, verdict.rejected_lines, verdict.error_count) == (5, 3, 4)
    assert verdict.reason == "3 of 5 input lines failed validation (4 errors)."

    lines = await error_lines(bus, object_store, verdict)
    assert [(line.custom_id, line.error and line.error.code) for line in lines] == [
        ("a", "batch_failed_validation"), ("b", "unknown_fields"), ("a", "duplicate_custom_id"),
        (None, "invalid_json"), ("c", "batch_failed_validation")]
    # Refused lines say what the regular call would have answered, and where they are; the others never ran.
    assert [(line.line, line.response and line.response.status_code) for line in lines] == [
        (None, None), (2, 400), (4, 400), (5, 400), (None, None)]
    assert len({line.id for line in lines}) == 5 and lines[0].id == batch_request_id(batch_id, "a")
    assert lines[1].error is not None and "[invalid_method at method]" in lines[1].error.message
    assert lines[0].error is not None and "allow_partial" in lines[0].error.message


async def test_a_file_past_the_line_limit_has_one_error_and_fails_even_with_allow_partial(
        bus: EventBus, object_store: ObjectStore, validator: None) -> None:
    content = b"\n".join(request_line(f"r{n}") for n in range(MAX_LINES + 25))
    batch_id = await submit(bus, object_store, content, allow_partial=True)
    facts = await batch_facts(bus, batch_id, is_verdict)
    assert [(f.line, f.code) for f in facts if isinstance(f, LineRejected)] == [(MAX_LINES + 1, "too_many_tasks")]
    verdict = facts[-1]
    assert isinstance(verdict, BatchValidationFailed)
    assert (verdict.error_count, verdict.counts_by_code) == (1, {"too_many_tasks": 1})
    assert verdict.reason is not None and verdict.reason.startswith(f"The file has more than {MAX_LINES} requests")

    lines = await error_lines(bus, object_store, verdict)
    codes = [line.error.code for line in lines if line.error is not None]
    assert len(lines) == MAX_LINES + 25 and codes.count("too_many_tasks") == 1
    assert codes[MAX_LINES] == "too_many_tasks" and set(codes) == {"too_many_tasks", "batch_failed_validation"}
