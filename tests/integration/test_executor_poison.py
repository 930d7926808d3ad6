"""One line never kills a batch: what the engine refuses at run time is an error line, each input line is
accounted for once (custom_ids may repeat), a batch failed at run time delivers what it committed, and a finalize
that cannot succeed ends its batch; against the real broker, S3 server and model."""

import asyncio
import json
import secrets
from typing import Literal

import orjson
from nats.js.api import ConsumerInfo

from contracts.api.rejected_line import RejectedLine
from contracts.commands import FinalizeBatch, RunBatch
from contracts.events.batch import AttemptFailed, BatchAssigned, BatchFailed, BatchProgressed
from contracts.ids import batch_request_id
from contracts.subjects import (
    WORK_STREAM,
    executor_durable,
    executor_finalize_durable,
    input_object_key,
    rejections_key,
    result_chunk_key,
    run_command,
)
from contracts.subjects import finalize_command as finalize_subject
from contracts.terms import BatchTerms
from services.executor.adapters.results import ResultStore
from services.executor.domain import Chunk, InputLine, result_line
from services.executor.settings import ExecutorSettings
from services.runtime.nats.bus import EventBus
from services.runtime.storage.objectstore import ObjectStore
from tests.batch_invariant import check_invariant
from tests.integration.test_executor_lifecycle import CHAT, chat, completed_fact, ended, executor, files_of
from tests.support import batch_facts

__all__ = ["executor"]  # the fixture, shared with the lifecycle tests

ENDPOINT = "/v1/chat/completions"
FINALIZE_BACKLOG = 70


def line(custom_id: str, body: dict[str, object]) -> bytes:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": ENDPOINT,
                       "body": {"model": CHAT, **body}}).encode()


def deep_schema(levels: int) -> dict[str, object]:
    schema: dict[str, object] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


async def run_batch(store: ObjectStore, executor: ExecutorSettings, lines: list[bytes],
                    rejected: tuple[RejectedLine, ...] = ()) -> RunBatch:
    batch_id = f"batch_{secrets.token_hex(6)}"
    key = input_object_key(f"file-in-{batch_id}")
    await store.put_bytes(key, b"".join(raw + b"\n" for raw in lines))
    if rejected:
        await store.put_bytes(rejections_key(batch_id),
                              b"".join(refused.model_dump_json().encode() + b"\n" for refused in rejected))
    return RunBatch(batch_id=batch_id, executor_id=executor.executor_id, attempt=1, lease_token="lease-1",
                    terms=BatchTerms(owner_key_id="key_owner", endpoint=ENDPOINT, input_object_key=key), model=CHAT,
                    total_lines=len(lines), rejections_object_key=rejections_key(batch_id) if rejected else None)


async def test_lines_the_engine_raises_on_go_to_the_error_file_and_the_good_lines_still_run(
    bus: EventBus, object_store: ObjectStore, executor: ExecutorSettings,
) -> None:
    image = {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": "data:,"}}]}]}
    deep_ignored = line("deep", chat(2)).replace(b'"seed": 2', b'"seed": 2, "user": ' + b"[" * 1000 + b"]" * 1000)
    lines = [
        line("good-1", chat(1)),
        line("image", {**image, "max_tokens": 4}),  # RuntimeError in llama.cpp: no mmproj
        line("tool", {**chat(3), "tools": [{"function": {"name": 5}}]}),  # RuntimeError parsing the tools
        line("schema", {**chat(4), "response_format": {"type": "json_schema", "json_schema": {
            "name": "s", "schema": deep_schema(150)}}}),  # TypeError: orjson writes at most 254 levels
        deep_ignored,  # orjson reads 1,000 levels (the stdlib json would not), the engine cannot write them
        line("good-2", chat(5)),
    ]
    command = await run_batch(object_store, executor, lines)
    await bus.send(command)

    facts = await batch_facts(bus, command.batch_id, ended)
    done = completed_fact(facts)
    assert (done.completed, done.failed) == (2, 4)
    assert "batch.attempt_failed" not in [fact.type for fact in facts]
    output, errors = await files_of(object_store, command.batch_id)
    check_invariant(6, 2, 4, output, errors)
    assert [orjson.loads(row)["custom_id"] for row in output.splitlines()] == ["good-1", "good-2"]
    refused = [orjson.loads(row) for row in errors.splitlines()]
    assert [row["custom_id"] for row in refused] == ["image", "tool", "schema", "deep"]
    assert all(row["response"]["status_code"] == 400 and row["response"]["body"]["error"]["code"] for row in refused)


async def test_a_refused_repeat_of_a_custom_id_leaves_the_first_line_to_run_and_every_line_counted_once(
    bus: EventBus, object_store: ObjectStore, executor: ExecutorSettings,
) -> None:
    lines = [line("A", chat(1)), line("B", chat(2)), line("A", chat(3)), line("C", chat(4))]
    repeat = RejectedLine(line=3, custom_id="A", code="duplicate_custom_id", param="custom_id",
                          message="custom_id 'A' was already used on line 1")
    command = await run_batch(object_store, executor, lines, (repeat,))
    await bus.send(command)

    done = completed_fact(await batch_facts(bus, command.batch_id, ended))
    assert (done.completed, done.failed) == (3, 1)
    output, errors = await files_of(object_store, command.batch_id)
    check_invariant(4, 3, 1, output, errors)
    rows = [orjson.loads(row) for row in output.splitlines()]
    assert [row["custom_id"] for row in rows] == ["A", "B", "C"]
    assert rows[0]["id"] == batch_request_id(command.batch_id, "A")
    error = orjson.loads(errors)
    assert (error["custom_id"], error["error"]["code"]) == ("A", "duplicate_custom_id")


async def test_a_batch_failed_at_run_time_delivers_its_committed_lines_and_names_its_cause(
    bus: EventBus, object_store: ObjectStore, executor: ExecutorSettings,
) -> None:
    lines = [line(f"line-{n}", chat(n)) for n in range(4)]
    lines[3] = line("deep", chat(3)).replace(b'"seed": 3', b'"seed": 3, "user": ' + b"[" * 1000 + b"]" * 1000)
    command = await run_batch(object_store, executor, lines)
    # What an attempt committed before the batch ran out of attempts: the first two lines.
    await bus.publish(BatchAssigned(aggregate_id=command.batch_id, executor_id=executor.executor_id, attempt=1,
                                    lease_token="t", shard=0, shards=1, shard_span=0))
    committed = [result_line(command.batch_id, InputLine(n + 1, f"line-{n}", {}), 200, {"n": n}) for n in range(2)]
    key = await ResultStore(object_store).put_chunk(command.batch_id, 1, Chunk(0, tuple(committed), 2, 0))
    await bus.publish(BatchProgressed(aggregate_id=command.batch_id, attempt=1, chunk=0, chunk_key=key,
                                      completed=2, failed=0))
    await bus.publish(AttemptFailed(aggregate_id=command.batch_id, attempt=1, executor_id=executor.executor_id,
                                    code="engine_crashed", reason="x"))
    await bus.send(finalize_command(command, "failed", failure_code="attempts_exhausted",
                                             failure_message="3 attempts failed without committing a line."))

    failed = (await batch_facts(bus, command.batch_id, ended))[-1]
    assert isinstance(failed, BatchFailed) and failed.code == "attempts_exhausted"
    assert (failed.completed, failed.failed) == (2, 2) and failed.reason.startswith("3 attempts")
    output, errors = await files_of(object_store, command.batch_id)
    check_invariant(4, 2, 2, output, errors)
    assert [orjson.loads(row)["error"]["code"] for row in errors.splitlines()] == ["batch_failed"] * 2


async def test_a_finalize_that_cannot_succeed_fails_its_batch_and_others_finalizes_still_complete(
    bus: EventBus, object_store: ObjectStore, executor: ExecutorSettings,
) -> None:
    poisoned = []
    for _ in range(FINALIZE_BACKLOG):  # more than a finalize durable once held at a time
        command = await run_batch(object_store, executor, [line("a", chat(1))])
        key = result_chunk_key(command.batch_id, 1, 0)
        await object_store.put_bytes(key, b"not a result chunk\n")
        await bus.publish(BatchProgressed(aggregate_id=command.batch_id, attempt=1, chunk=0, chunk_key=key,
                                          completed=1, failed=0))
        await bus.send(finalize_command(command, "cancelled"))
        poisoned.append(command)
    other = await run_batch(object_store, executor, [line("b", chat(2))])
    await bus.send(finalize_command(other.model_copy(update={"owner_key_id": "key_other"}), "expired"))

    assert (await batch_facts(bus, other.batch_id, ended, timeout_s=60))[-1].type == "batch.expired"
    for command in poisoned:
        failed = (await batch_facts(bus, command.batch_id, ended, timeout_s=30))[-1]
        assert isinstance(failed, BatchFailed) and failed.code == "finalize_failed"
        assert "could not be assembled" in failed.reason and failed.completed is None


async def test_a_finalize_command_naming_another_executor_is_dropped_and_leaves_its_batch_alone(
    bus: EventBus, object_store: ObjectStore, executor: ExecutorSettings,
) -> None:
    command = await run_batch(object_store, executor, [line("a", chat(1))])
    misrouted = finalize_command(command, "cancelled").model_copy(update={"executor_id": "someone-else"})
    await bus.js.publish(finalize_subject(executor.executor_id), misrouted.model_dump_json().encode(),
                         headers={"Nats-Msg-Id": misrouted.msg_id}, stream=WORK_STREAM)
    await bus.send(finalize_command(command, "expired"))

    # Taken in order: had the misrouted cancel been acted on (or failed the batch), it would have ended first.
    facts = await batch_facts(bus, command.batch_id, ended)
    assert [fact.type for fact in facts if ended(fact)] == ["batch.expired"]


async def test_commands_that_do_not_decode_are_given_up_at_once_and_the_next_ones_run(
    bus: EventBus, object_store: ObjectStore, executor: ExecutorSettings,
) -> None:
    for subject in (run_command(executor.executor_id), finalize_subject(executor.executor_id)):
        for garbage in (b"not json", b'{"batch_id": "batch_x"}'):
            await bus.js.publish(subject, garbage, headers={"Nats-Msg-Id": secrets.token_hex(8)}, stream=WORK_STREAM)
    command = await run_batch(object_store, executor, [line("a", chat(1))])
    await bus.send(command)

    assert completed_fact(await batch_facts(bus, command.batch_id, ended)).completed == 1
    for durable, taken in ((executor_durable(executor.executor_id), 3),
                           (executor_finalize_durable(executor.executor_id), 2)):
        info = await settled(bus, durable)
        assert info.delivered is not None
        assert info.delivered.consumer_seq == taken and info.num_redelivered == 0, "each delivered once"
        assert info.num_pending == 0, "and terminated, not left to redeliver"


async def test_a_run_command_naming_another_executor_fails_its_attempt_once_and_runs_nothing(
    bus: EventBus, object_store: ObjectStore, executor: ExecutorSettings,
) -> None:
    command = await run_batch(object_store, executor, [line("a", chat(1))])
    misrouted = command.model_copy(update={"executor_id": "someone-else", "attempt": 2})
    await bus.js.publish(run_command(executor.executor_id), misrouted.model_dump_json().encode(),
                         headers={"Nats-Msg-Id": misrouted.msg_id}, stream=WORK_STREAM)

    facts = await batch_facts(bus, command.batch_id, lambda fact: isinstance(fact, AttemptFailed))
    failed = facts[-1]
    assert isinstance(failed, AttemptFailed) and (failed.attempt, failed.code) == (2, "executor_error")
    assert "command for executor someone-else reached" in failed.reason
    assert [fact.type for fact in facts] == ["batch.attempt_failed"], "nothing ran"
    info = await bus.js.consumer_info(WORK_STREAM, executor_durable(executor.executor_id))
    assert info.num_redelivered == 0 and info.num_ack_pending == 0


async def settled(bus: EventBus, durable: str) -> ConsumerInfo:
    """The durable once nothing it delivered waits for an ack."""
    for _ in range(100):
        info = await bus.js.consumer_info(WORK_STREAM, durable)
        if not info.num_ack_pending:
            return info
        await asyncio.sleep(0.1)
    raise AssertionError(f"{durable} still has unacked commands")


def finalize_command(command: RunBatch, reason: Literal["cancelled", "expired", "failed"],
                     **failure: str) -> FinalizeBatch:
    return FinalizeBatch(batch_id=command.batch_id, executor_id=command.executor_id, reason=reason,
                         terms=command.terms, **failure)
