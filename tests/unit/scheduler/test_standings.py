"""Every open batch is told where it stands: a queued one its place for its model and an ETA from the fleet's
measured rate, a running one how far along it is; a batch waiting for a reason of its own keeps it, and one pass
states only so many, front of the queue first."""

from contracts.events.batch import BatchProgressed, BatchWaiting
from services.scheduler.book import Book
from services.scheduler.decisions import Wait
from services.scheduler.fair_share import Weights
from services.scheduler.standings import FIRST_STANDING_AFTER_MS, MOST_PER_PASS, standing_waits
from tests.unit.scheduler.test_scheduler_decisions import NOW, assign
from tests.unit.scheduler.test_scheduler_turns import fleet_book, queue


def told(book: Book, now_ms: int = NOW) -> dict[str, str]:
    waits = standing_waits(book, Weights(), now_ms)
    assert all(isinstance(wait, Wait) for wait in waits)
    return {wait.plan.batch_id: wait.reason for wait in waits}


def waiting(book: Book, batch: str, reason: str, at_ms: int = NOW - 60_000) -> None:
    book.apply(BatchWaiting(aggregate_id=batch, reason=reason, occurred_at=at_ms))


def test_a_queued_batch_is_told_its_place_and_eta_and_a_running_one_its_progress() -> None:
    book = fleet_book()
    queue(book, "running", "ann")
    assign(book, "e1", 1, "running")
    book.apply(BatchProgressed(aggregate_id="running", attempt=1, chunk=0, chunk_key="k", completed=1, failed=0,
                               occurred_at=NOW - 1000))
    queue(book, "next", "bob")
    waiting(book, "next", "Queued: every executor serving m is busy with other batches.")
    reasons = told(book)
    assert reasons["running"] == "Running on 1 executor: 33 % done, under a minute left."
    assert reasons["next"] == "Queued: 2nd for m, under a minute."


def test_without_a_measured_rate_there_is_no_eta() -> None:
    book = fleet_book()
    queue(book, "first", "ann")
    waiting(book, "first", "Queued: every executor serving m is busy with other batches.")
    assert told(book) == {"first": "Queued: 1st for m."}


def test_a_batch_waiting_for_a_reason_of_its_own_keeps_it() -> None:
    book = fleet_book()
    queue(book, "lonely", "ann")
    waiting(book, "lonely", "No online executor serves m.")
    assert told(book) == {}


def test_a_standing_already_stated_is_not_stated_again() -> None:
    book = fleet_book()
    queue(book, "first", "ann")
    waiting(book, "first", "Queued: 1st for m.")
    assert told(book) == {}


def test_one_pass_states_only_so_many_front_of_the_queue_first() -> None:
    book = fleet_book()
    for n in range(MOST_PER_PASS + 5):
        queue(book, f"b{n}", f"owner{n}")
        waiting(book, f"b{n}", "Queued: every executor serving m is busy with other batches.")
    reasons = told(book)
    assert len(reasons) == MOST_PER_PASS
    assert "b0" in reasons and f"b{MOST_PER_PASS + 4}" not in reasons


def validated_at(book: Book, batch: str, owner: str, at_ms: int) -> None:
    queue(book, batch, owner)
    book.plans[batch].validated_at_ms = at_ms  # as if its `batch.validated` had been stored then


def test_a_batch_never_told_why_it_waits_is_told_its_place_once_it_has_waited_a_moment() -> None:
    book = fleet_book()
    validated_at(book, "first", "ann", NOW - FIRST_STANDING_AFTER_MS)
    assert told(book) == {"first": "Queued: 1st for m."}


def test_a_batch_just_validated_is_told_nothing_for_it_is_likely_placed_at_once() -> None:
    book = fleet_book()
    validated_at(book, "fresh", "ann", NOW - FIRST_STANDING_AFTER_MS + 1)
    assert told(book) == {}
