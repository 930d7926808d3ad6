"""The leading scheduler never assigns a unit of a batch whose cancel is already in the log, even while its book has
not folded that cancel yet: the assignment is published on the condition that no cancel came, against a real
nats-server (an assignment after a cancel was a ledger anomaly, and ran lines nobody wanted)."""

import secrets
from types import SimpleNamespace
from typing import Any

import pytest

from contracts.events.batch import BatchAssigned, BatchCancelRequested, BatchValidated
from contracts.subjects import batch_fact
from services.runtime.nats import eventlog
from services.runtime.nats.bus import EventBus
from services.scheduler.actions import Assign
from services.scheduler.term import Term
from tests.factories import batch_created


async def test_a_unit_of_a_batch_cancelled_before_the_book_knew_is_not_assigned_and_gets_no_run_command(
        bus: EventBus, monkeypatch: pytest.MonkeyPatch) -> None:
    nothing: Any = SimpleNamespace(store=None)
    term = Term(bus=bus, fleet=nothing, catalogue=nothing, read_model=nothing, signer=nothing)
    runs: list[str] = []

    async def send_run(plan: Any, executor_id: str, attempt: int, shard: int) -> None:
        runs.append(executor_id)
    monkeypatch.setattr(term, "_send_run", send_run)
    cancelled, open_batch = f"batch_{secrets.token_hex(6)}", f"batch_{secrets.token_hex(6)}"
    for batch_id in (cancelled, open_batch):
        for fact in (batch_created(batch_id), BatchValidated(aggregate_id=batch_id, total_lines=2, model="m")):
            term.book.apply(fact)  # the book knows the batch as validated, and nothing after
    await bus.publish(BatchCancelRequested(aggregate_id=cancelled, requested_by_key_id="key_test"))

    for batch_id in (cancelled, open_batch):
        await term._assign(Assign(term.book.open[batch_id], "exec-1", 1))

    assert runs == ["exec-1"]  # the open batch's only
    assert [fact async for fact in eventlog.read(bus, batch_fact(cancelled, BatchAssigned.name))] == []
    assert len([fact async for fact in eventlog.read(bus, batch_fact(open_batch, BatchAssigned.name))]) == 1
