"""Several facts in one fact-desk submission (real broker): stored in order, each judged as if it came alone and
each once however often the submission is sent; the first one not stored ends it, under one fence for all."""

import secrets

import pytest

from contracts.commands import RunBatch
from contracts.events.batch import AttemptFailed, BatchFinalizing, BatchProgressed
from contracts.events.registry import AnyEvent
from contracts.subjects import attempt_failures, input_object_key, result_chunk_key
from contracts.terms import BatchTerms
from services.executor.adapters.desk import FactDesk, FactRefused
from services.runtime.nats.bus import EventBus, Fence, FenceMoved
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
