"""Several facts in one fact-desk submission (real broker): stored in order, each judged as if it came alone and
each once however often the submission is sent; the first one not stored ends it, under one fence for all."""

import hashlib
import json
import secrets
import time

import pytest

from contracts.api.file import RESULT_FILE_EXPIRES_AFTER_S
from contracts.commands import RunBatch
from contracts.events.batch import AttemptFailed, BatchCancelRequested, BatchFinalizing, BatchProgressed, BatchStarted
from contracts.events.file import FileStored
from contracts.events.key import KeyRevoked
from contracts.events.registry import AnyEvent
from contracts.fact_desk import MAX_STATED_FACT_CHARS, FactReceipt
from contracts.ids import output_file_id, result_file_name
from contracts.subjects import (
    attempt_failures,
    batch_fact,
    fact_submissions,
    input_object_key,
    key_fact,
    result_chunk_key,
)
from contracts.terms import BatchTerms
from services.executor.adapters.desk import FactDesk, FactRefused
from services.runtime.nats.bus import EventBus, Fence, FenceMoved
from services.runtime.nats.facts import last_fact
from services.runtime.storage.objectstore import ObjectStore
from tests.integration.desk_support import fact_desk, hold
from tests.support import batch_facts

EXECUTOR = "desk-exec"


def assigned_run() -> RunBatch:
    return RunBatch(batch_id=f"batch_{secrets.token_hex(6)}", executor_id=EXECUTOR, attempt=1, lease_token="lease-1",
                    terms=BatchTerms(owner_key_id="key_owner", endpoint="/v1/chat/completions",
                                     input_object_key=input_object_key("file-in")), model="m", total_lines=3)


def progressed(run: RunBatch, attempt: int = 1) -> BatchProgressed:
    return BatchProgressed(aggregate_id=run.batch_id, attempt=attempt, chunk=0,
                           chunk_key=result_chunk_key(run.batch_id, attempt, 0), completed=3, failed=0)


def ended(run: RunBatch, attempt: int) -> AttemptFailed:
    """The attempt's failure: it moves the fence, and a test reads the log up to it."""
    return AttemptFailed(aggregate_id=run.batch_id, attempt=attempt, executor_id=EXECUTOR, code="executor_error",
                         reason="the test ends it")


def execution_facts(facts: list[AnyEvent]) -> list[str]:
    return [fact.type for fact in facts if isinstance(fact, BatchProgressed | BatchFinalizing | AttemptFailed)]


async def test_the_facts_of_one_submission_are_stored_in_order_and_once_however_often_it_is_sent(bus: EventBus) -> None:
    run = assigned_run()
    async with fact_desk(bus) as book:
        hold(book, run)
        desk = FactDesk(bus.nc, EXECUTOR, wait_s=5)
        fence = Fence(attempt_failures(run.batch_id), 0)
        facts = (progressed(run), BatchFinalizing(aggregate_id=run.batch_id, attempt=1))
        stored = await desk.submit(*facts, fence=fence)
        assert await desk.submit(*facts, fence=fence) == stored, "a retried submission stores nothing again"
        await bus.publish(ended(run, 1))
    logged = await batch_facts(bus, run.batch_id, lambda fact: isinstance(fact, AttemptFailed))
    assert execution_facts(logged) == ["batch.progressed", "batch.finalizing", "batch.attempt_failed"]


async def test_a_fact_the_executor_may_not_state_ends_the_submission_and_those_before_it_stay_stored(
        bus: EventBus) -> None:
    run = assigned_run()
    async with fact_desk(bus) as book:
        hold(book, run)
        desk = FactDesk(bus.nc, EXECUTOR, wait_s=5)
        with pytest.raises(FactRefused, match=r"attempt 2 .* was not assigned"):
            await desk.submit(progressed(run), progressed(run, attempt=2),
                              BatchFinalizing(aggregate_id=run.batch_id, attempt=1))
        await bus.publish(ended(run, 1))
    logged = await batch_facts(bus, run.batch_id, lambda fact: isinstance(fact, AttemptFailed))
    assert execution_facts(logged) == ["batch.progressed", "batch.attempt_failed"]


async def test_once_the_fence_moved_no_fact_of_the_submission_is_stored(bus: EventBus) -> None:
    run = assigned_run()
    async with fact_desk(bus) as book:
        hold(book, run)
        desk = FactDesk(bus.nc, EXECUTOR, wait_s=5)
        failed = await bus.publish(ended(run, 1))
        with pytest.raises(FenceMoved) as moved:
            await desk.submit(progressed(run), BatchFinalizing(aggregate_id=run.batch_id, attempt=1),
                              fence=Fence(attempt_failures(run.batch_id), 0))
        assert moved.value.last_sequence == failed
        await bus.publish(ended(run, 2))
    logged = await batch_facts(bus, run.batch_id, lambda fact: isinstance(fact, AttemptFailed) and fact.attempt == 2)
    assert execution_facts(logged) == ["batch.attempt_failed", "batch.attempt_failed"]


async def test_a_fact_is_stored_under_the_id_its_content_gives_never_one_the_executor_chose(bus: EventBus) -> None:
    """The broker drops a message whose id it has seen (whatever its subject): an executor naming its own fact with
    the id of a cancel or a revocation to come must not have that cancel or revocation dropped as a repeat."""
    run = assigned_run()
    cancel = BatchCancelRequested(aggregate_id=run.batch_id, requested_by_key_id="key_owner")
    revocation = KeyRevoked(aggregate_id="key_of_the_executor", key_sha256="ab" * 32)
    async with fact_desk(bus) as book:
        hold(book, run)
        desk = FactDesk(bus.nc, EXECUTOR, wait_s=5)
        started = BatchStarted(aggregate_id=run.batch_id, executor_id=EXECUTOR, attempt=1, engine="llamacpp",
                               engine_version="1")
        first = await desk.submit(started.model_copy(update={"event_id": cancel.event_id,
                                                             "correlation_id": "x" * 5_000,
                                                             "causation_id": "y" * 5_000}))
        second = await desk.submit(progressed(run).model_copy(update={"event_id": revocation.event_id}))

        assert await bus.publish(cancel, fence=Fence(batch_fact(run.batch_id, "finalizing"), 0)) not in (first, second)
        assert await bus.publish(revocation) not in (first, second)
    assert await last_fact(bus, batch_fact(run.batch_id, "cancel_requested")) is not None
    assert await last_fact(bus, key_fact(revocation.aggregate_id, "revoked")) is not None
    logged = await batch_facts(bus, run.batch_id, lambda fact: isinstance(fact, BatchCancelRequested))
    [stored] = [fact for fact in logged if isinstance(fact, BatchStarted)]
    assert (stored.event_id, stored.correlation_id, stored.causation_id) == (started.event_id, run.batch_id, None)


async def test_a_result_files_stated_size_and_name_must_be_those_of_its_object(bus: EventBus,
                                                                              object_store: ObjectStore) -> None:
    """A result file counts against its owner's storage quota: one stated at an exabyte would refuse every upload of
    theirs. Its name is shown in their file list."""
    run = assigned_run()
    file_id = output_file_id(run.batch_id)
    data = b'{"custom_id": "a"}\n'
    await object_store.put_bytes(input_object_key(file_id), data)
    async with fact_desk(bus, store=object_store) as book:
        hold(book, run)
        desk = FactDesk(bus.nc, EXECUTOR, wait_s=5)
        now = int(time.time())
        stored = FileStored(aggregate_id=file_id, owner_key_id="key_owner", purpose="batch_output",
                            filename=result_file_name(run.batch_id, "output"), bytes=len(data), line_count=1,
                            sha256=hashlib.sha256(data).hexdigest(), object_key=input_object_key(file_id),
                            created_at=now, expires_at=now + RESULT_FILE_EXPIRES_AFTER_S, batch_id=run.batch_id)
        with pytest.raises(FactRefused, match="states 1000000000000000000 bytes; its object holds 19"):
            await desk.submit(stored.model_copy(update={"bytes": 10**18}))
        with pytest.raises(FactRefused, match="is named"):
            await desk.submit(stored.model_copy(update={"filename": "x" * 10_000}))
        oversized = progressed(run).model_copy(update={"chunk_key": "k" * (MAX_STATED_FACT_CHARS + 1)})
        raw = b'{"event": %s}' % json.dumps(oversized.model_dump_json()).encode()
        answer = await bus.nc.request(fact_submissions(EXECUTOR), raw, timeout=5)
        receipt = FactReceipt.model_validate_json(answer.data)
        assert receipt.status == "refused" and "Malformed submission" in (receipt.reason or "")
        assert await desk.submit(stored) > 0
