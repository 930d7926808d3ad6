"""Free capacity goes to owners in turns: an executor gets no more units than it runs at once, and the next free
place goes to the owner with the fewest lines running, not to whoever queued the most first."""

from contracts.api.batch import BatchUsage
from contracts.events.batch import BatchCompleted, BatchValidated, BatchWaiting
from contracts.events.executor import ExecutorAdvert
from services.scheduler.book import Book
from services.scheduler.decisions import Assign, Wait, decide
from tests.factories import batch_created
from tests.unit.scheduler.test_scheduler_decisions import CATALOGUE, NOW, advert, assign


def queue(book: Book, batch: str, owner: str) -> None:
    book.apply(batch_created(batch, owner, "files/f", created_at=0, expires_at=NOW // 1000 + 3600))
    book.apply(BatchValidated(aggregate_id=batch, total_lines=3, model="m"))


def fleet_book() -> Book:
    return Book(admitted={"e1", "e2"}, known_executors={"e1": NOW, "e2": NOW})


def assigned(book: Book, adverts: list[ExecutorAdvert]) -> list[str]:
    return [action.plan.batch_id for action in decide(book, adverts, CATALOGUE, NOW) if isinstance(action, Assign)]


def test_an_executor_is_given_no_more_attempts_than_it_runs_at_once() -> None:
    book = fleet_book()
    for n in range(5):
        queue(book, f"b{n}", "ann")
    assert assigned(book, [advert("e1", parallel=2)]) == ["b0", "b1"]


def test_a_batch_that_finds_every_able_executor_full_is_left_to_the_standings_to_tell() -> None:
    book = fleet_book()
    queue(book, "running", "ann")
    assign(book, "e1", 1, "running")
    queue(book, "next", "bob")
    actions = decide(book, [advert("e1", parallel=1)], CATALOGUE, NOW)
    assert not [action for action in actions if isinstance(action, Wait)]


def test_a_batch_whose_stated_reason_no_longer_holds_is_told_it_waits_queued_at_once() -> None:
    book = fleet_book()
    queue(book, "running", "ann")
    assign(book, "e1", 1, "running")
    queue(book, "next", "bob")
    book.apply(BatchWaiting(aggregate_id="next", reason="No online executor serves m.", occurred_at=NOW - 1))
    actions = decide(book, [advert("e1", parallel=1)], CATALOGUE, NOW)
    waits = [action for action in actions if isinstance(action, Wait)]
    assert [w.plan.batch_id for w in waits] == ["next"] and "busy" in waits[0].reason


def test_owners_take_turns_for_free_capacity_whatever_they_queued_first() -> None:
    book = fleet_book()
    for n in range(4):
        queue(book, f"ann{n}", "ann")
    queue(book, "bob0", "bob")
    queue(book, "cy0", "cy")
    assert assigned(book, [advert("e1", parallel=3)]) == ["ann0", "bob0", "cy0"]


def test_an_owner_with_attempts_running_comes_after_one_with_none() -> None:
    book = fleet_book()
    queue(book, "ann-running", "ann")
    assign(book, "e1", 1, "ann-running")
    queue(book, "ann-next", "ann")
    queue(book, "bob-first", "bob")
    assert assigned(book, [advert("e1", parallel=2)]) == ["bob-first"]


def test_an_ended_batch_holds_no_place_on_its_executor() -> None:
    """A batch that finalized itself states no shard finished: its last attempt still reads as running in its plan."""
    book = fleet_book()
    queue(book, "done", "ann")
    assign(book, "e1", 1, "done")
    book.apply(BatchCompleted(aggregate_id="done", output_file_id="out", error_file_id=None, completed=3, failed=0,
                              usage=BatchUsage(input_tokens=3, output_tokens=3, total_tokens=6)))
    queue(book, "next", "ann")
    assert assigned(book, [advert("e1", parallel=1)]) == ["next"]


def test_a_full_executor_takes_newcomers_in_its_guest_places_and_only_them() -> None:
    book = fleet_book()
    queue(book, "ann-running", "ann")
    assign(book, "e1", 1, "ann-running")
    queue(book, "ann-next", "ann")
    for owner in ("bob", "cy", "dan"):
        queue(book, f"{owner}-first", owner)
    full = advert("e1", parallel=1).model_copy(update={"guest_attempts": 2})
    assert assigned(book, [full]) == ["bob-first", "cy-first"], "ann has a unit running: no guest place for her"


def test_guest_places_are_taken_only_once_the_own_places_are() -> None:
    book = fleet_book()
    queue(book, "ann0", "ann")
    queue(book, "ann1", "ann")
    roomy = advert("e1", parallel=1).model_copy(update={"guest_attempts": 2})
    assert assigned(book, [roomy]) == ["ann0"], "ann's second batch is not a newcomer's once her first runs"
