"""The control plane's finalizer remembers a batch's pauses only while the batch is open: a try that found an
attempt still running, or that failed, is forgotten once the batch ends, whoever ended it (most often the executor
it waited for), so a leading scheduler's memory does not grow with every batch it ever deferred."""

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from contracts.commands import FinalizeBatch
from contracts.subjects import batch_fact
from services.runtime.nats.follower import Fact
from services.scheduler.closer import StillRunning
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
