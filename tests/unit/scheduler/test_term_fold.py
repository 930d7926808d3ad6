"""What the leading scheduler's fold of the log keeps, and what it survives. The control plane's finalizer remembers
a batch's pauses only while the batch is open: a try that found an attempt still running, or that failed, is
forgotten once the batch ends, whoever ended it (most often the executor it waited for), so a leader's memory does
not grow with every batch it ever deferred. A fact whose rule raises is left out, never the end of the term."""

import asyncio
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from contracts.commands import FinalizeBatch
from contracts.events.envelope import Event
from contracts.events.registry import AnyEvent, decode_event
from contracts.subjects import batch_fact
from services.runtime.nats.follower import Fact
from services.runtime.nats.kv import ScanFailed
from services.scheduler.book import ENDED_PLANS_KEPT_MS, FORGOTTEN_IDS_KEPT_MS, Book
from services.scheduler.closer import StillRunning
from services.scheduler.entitlements import may_read
from services.scheduler.plans import BatchPlan
from services.scheduler.term import Term
from tests.factories import T0, batch_life, batch_terms

BATCHES = 40


def facts_of(events: Sequence[Event], first: int = 1) -> list[Fact]:
    return [Fact(sequence, batch_fact(event.aggregate_id, event.name), event.model_dump_json().encode())
            for sequence, event in enumerate(events, first)]


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
    lives = [batch_life(batch_id, chunks=1) for batch_id in ids]
    term.fold(facts_of([event for life in lives for event in life[:-1]]))
    for batch_id in ids:
        term.closer.close(FinalizeBatch(batch_id=batch_id, executor_id="control-plane", reason="completed",
                                        terms=batch_terms()), lambda: None)
    await asyncio.gather(*term.closer.tasks.values())
    assert len(term.closer.waits) + len(term.closer.tries) == BATCHES

    term.fold(facts_of([life[-1] for life in lives], first=10_000))  # each ends by its executor

    assert term.closer.waits == {} and term.closer.tries == {}


async def test_a_try_that_fails_after_its_batch_ended_elsewhere_leaves_no_pause(
        monkeypatch: pytest.MonkeyPatch) -> None:
    term = term_with_closer()
    life = batch_life("batch_racing", chunks=1)
    term.fold(facts_of(life[:-1]))

    async def ended_meanwhile(command: FinalizeBatch) -> None:
        term.fold(facts_of(life[-1:], first=len(life)))  # its executor's end is folded while this try runs
        raise RuntimeError("the object store blinked")

    monkeypatch.setattr(term.closer, "finalize", ended_meanwhile)
    term.closer.close(FinalizeBatch(batch_id="batch_racing", executor_id="control-plane", reason="completed",
                                    terms=batch_terms()), lambda: None)
    await asyncio.gather(*term.closer.tasks.values())
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


def lived(batch_id: str, at_ms: int) -> list[AnyEvent]:
    """A batch's whole life, each fact stated at `at_ms`."""
    return [decode_event(event.model_copy(update={"occurred_at": at_ms}).model_dump_json().encode())
            for event in batch_life(batch_id, chunks=1)]


def test_an_ended_plan_is_forgotten_an_hour_after_its_end_and_a_repeat_of_its_create_brings_none_back() -> None:
    book = Book()
    start = T0 * 1000  # the batches expire a day after
    for event in lived("batch_old", start):
        book.apply(event)
    assert "batch_old" in book.plans and book.open == {} and book.queued_lines == {}

    for event in lived("batch_soon_after", start + ENDED_PLANS_KEPT_MS // 2):
        book.apply(event)
    assert "batch_old" in book.plans, "late facts and reads of its executors are still judged by it"

    for event in lived("batch_much_later", start + ENDED_PLANS_KEPT_MS + 1):
        book.apply(event)
    assert set(book.plans) == {"batch_soon_after", "batch_much_later"}
    assert may_read(book, "exec-1", "batch_old") is None, "the executor it had may still read how it ended"
    assert may_read(book, "exec-2", "batch_old") is not None

    book.apply(lived("batch_old", start)[0])  # its create, stated again (a late retry)
    assert "batch_old" not in book.plans and "batch_old" not in book.open
    behind = lived("batch_new", start - 2 * ENDED_PLANS_KEPT_MS)[0]  # from a gateway whose clock is hours behind
    book.apply(behind)
    assert "batch_new" in book.open, "a new batch is taken whatever its gateway's clock says"

    assert "batch_old" in book.forgotten
    far = start + 86_400_000 + FORGOTTEN_IDS_KEPT_MS + 2 * ENDED_PLANS_KEPT_MS
    for event in lived("batch_far_later", far):
        book.apply(event)
    assert "batch_old" not in book.forgotten, "its id too is dropped once no create of it could run any more"


async def test_a_tick_whose_scan_the_broker_broke_off_is_tried_again_next_tick_not_the_end_of_the_term() -> None:
    term = term_with_closer()
    stop = asyncio.Event()
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        ticks += 1
        if ticks == 1:
            raise ScanFailed("the scan was broken off (a broker stalled for seconds)")
        stop.set()

    async def resend_runs() -> None:
        return None

    async def keep(until: asyncio.Event) -> None:
        await until.wait()

    lease: Any = SimpleNamespace(keep=keep, lost=lambda: False)
    folds: Any = SimpleNamespace(ended=lambda: False, failure=lambda: None)
    term.tick, term.resend_runs = tick, resend_runs  # type: ignore[method-assign]
    term.caught_up.set()
    await asyncio.wait_for(term.lead(lease, 0.01, stop, folds), 10)
    assert ticks == 2
