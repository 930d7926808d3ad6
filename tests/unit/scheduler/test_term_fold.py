"""What the leading scheduler's fold of the log keeps, and what it survives. The control plane's finalizer remembers
a batch's pauses only while the batch is open: a try that found an attempt still running, or that failed, is
forgotten once the batch ends, whoever ended it (most often the executor it waited for), so a leader's memory does
not grow with every batch it ever deferred. A fact whose rule raises is left out, never the end of the term."""

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from contracts.commands import FinalizeBatch
from contracts.subjects import batch_fact
from services.runtime.nats.follower import Fact
from services.scheduler.closer import StillRunning
from services.scheduler.plans import BatchPlan
from services.scheduler.term import Term
from tests.factories import batch_life, batch_terms

BATCHES = 40


def term_with_closer() -> Term:
    nothing: Any = SimpleNamespace(store=None)  # the fold and the closer's pauses touch no broker and no store
    return Term(bus=nothing, fleet=nothing, catalogue=nothing, read_model=nothing, signer=nothing)


async def test_pauses_of_batches_that_ended_elsewhere_are_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    term = term_with_closer()
    tries = 0

    async def finalize(command: FinalizeBatch) -> None:
        nonlocal tries
        tries += 1
        if tries % 2:
            raise StillRunning("attempt 1 may still run")
        raise RuntimeError("the object store blinked")

    monkeypatch.setattr(term.closer, "finalize", finalize)
    ids = [f"batch_{number}" for number in range(BATCHES)]
    for batch_id in ids:
        term.closer.close(FinalizeBatch(batch_id=batch_id, executor_id="control-plane", reason="completed",
                                        terms=batch_terms()), lambda: None)
    await asyncio.gather(*term.closer.tasks.values())
    assert len(term.closer.waits) + len(term.closer.tries) == BATCHES

    facts = [event for batch_id in ids for event in batch_life(batch_id, chunks=1)]
    term.fold([Fact(sequence, batch_fact(event.aggregate_id, event.name), event.model_dump_json().encode())
               for sequence, event in enumerate(facts, 1)])

    assert term.closer.waits == {} and term.closer.tries == {}


def test_a_fact_whose_rule_raises_is_left_out_and_the_book_folds_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """One fact no rule of the book foresaw ends no term (a new one would fold it again, and fail again): it leaves
    its own batch as it was, and every other batch's facts fold."""
    term = term_with_closer()
    reindex = BatchPlan.reindex

    def poisoned(plan: BatchPlan, index: int) -> None:
        if plan.batch_id == "batch_poisoned":
            raise KeyError("a state no rule foresaw")
        reindex(plan, index)

    monkeypatch.setattr(BatchPlan, "reindex", poisoned)
    facts = [event for batch_id in ("batch_poisoned", "batch_healthy") for event in batch_life(batch_id, chunks=1)]
    term.fold([Fact(sequence, batch_fact(event.aggregate_id, event.name), event.model_dump_json().encode())
               for sequence, event in enumerate(facts, 1)])

    assert term.book.plans["batch_healthy"].phase == "ended"
    assert term.book.plans["batch_poisoned"].phase == "ended", "its later facts fold as they come"
