"""Who finalizes a batch: one executor the scheduler chooses, preferring one that ran it; nobody else may."""

from collections.abc import Sequence

from contracts.commands import FinalizeBatch
from contracts.events.batch import AttemptFailed, BatchCancelRequested, BatchCompleted, BatchUsage, ShardFinished
from contracts.ids import output_file_id
from contracts.objects import ObjectRequest
from contracts.subjects import input_object_key
from services.scheduler.book import Book
from services.scheduler.decisions import Action, DeclareLost, Finalize, decide
from services.scheduler.domain import HEARTBEAT_FRESH_MS
from services.scheduler.entitlements import may_read, may_state
from services.scheduler.objects import authorize
from tests.unit.test_scheduler_decisions import CATALOGUE, NOW, advert, assign, validated_book
from tests.unit.test_scheduler_units import POLICY, apply_assignments, book_with

LATER = NOW + HEARTBEAT_FRESH_MS + 1


def finalizes_of(actions: Sequence[Action]) -> list[Finalize]:
    return [action for action in actions if isinstance(action, Finalize)]


def sharded_and_finished(fleet: list[str]) -> Book:
    """b1 ran as two units, attempt 1 on the first of `fleet` and attempt 2 on the second; both finished."""
    book = book_with("b1", 100)
    for assigned in apply_assignments(book, decide(book, [advert(e) for e in fleet], CATALOGUE, NOW, POLICY)):
        book.apply(ShardFinished(aggregate_id="b1", attempt=assigned.attempt, shard=assigned.shard,
                                 executor_id=assigned.executor_id))
    return book


def test_the_finalizer_is_the_live_executor_of_the_batchs_latest_attempt() -> None:
    book = sharded_and_finished(["e1", "e2"])
    assert book.plans["b1"].assignees == {1: "e1", 2: "e2"}
    [finalize] = finalizes_of(decide(book, [advert("e1"), advert("e2"), advert("e3")], CATALOGUE, NOW, POLICY))
    assert (finalize.reason, finalize.executor_id) == ("completed", "e2")


def test_an_executor_that_ran_the_batch_is_preferred_to_one_that_did_not() -> None:
    book = sharded_and_finished(["e1", "e2"])
    book.note_heartbeats([advert("e1", heartbeat_at=LATER), advert("e3", heartbeat_at=LATER)])
    fleet = [advert("e1", heartbeat_at=LATER), advert("e3", heartbeat_at=LATER)]
    [finalize] = finalizes_of(decide(book, fleet, CATALOGUE, LATER, POLICY))
    assert finalize.executor_id == "e1", "e2 is silent; e1 ran shard 0"


def test_with_no_executor_of_the_batch_live_another_live_admitted_one_finalizes() -> None:
    book = validated_book()
    book.apply(BatchCancelRequested(aggregate_id="b1", requested_by_key_id="k", occurred_at=NOW))
    [finalize] = finalizes_of(decide(book, [advert("e3"), advert("e2")], CATALOGUE, NOW))
    assert (finalize.reason, finalize.executor_id) == ("cancelled", "e2")
    book.admitted.discard("e2")
    [finalize] = finalizes_of(decide(book, [advert("e3"), advert("e2")], CATALOGUE, NOW))
    assert finalize.executor_id == "e3", "an executor that never proved a worker key finalizes nothing"


def test_with_no_live_executor_nothing_is_finalized_until_one_is() -> None:
    book = validated_book()
    book.apply(BatchCancelRequested(aggregate_id="b1", requested_by_key_id="k", occurred_at=NOW))
    assert finalizes_of(decide(book, [], CATALOGUE, NOW)) == []
    assert book.plans["b1"].finalizer is None
    [finalize] = finalizes_of(decide(book, [advert("e4")], CATALOGUE, NOW))
    assert finalize.executor_id == "e4"


def test_a_finalizer_that_goes_silent_has_the_finalize_sent_to_another_and_only_then() -> None:
    book = validated_book(expires_at=NOW // 1000 - 1)
    assign(book, "e1", 1)
    book.apply(AttemptFailed(aggregate_id="b1", attempt=1, executor_id="e1", code="batch_expired", reason="x"))
    [first] = finalizes_of(decide(book, [advert("e1"), advert("e2")], CATALOGUE, NOW))
    assert first.executor_id == "e1"
    book.plans["b1"].finalizer = first.executor_id
    assert finalizes_of(decide(book, [advert("e1"), advert("e2")], CATALOGUE, NOW + 1000)) == []
    assert finalizes_of(decide(book, [advert("e2")], CATALOGUE, NOW + 1000)) == [], "one scan missing its advert"

    fleet = [advert("e2", heartbeat_at=LATER)]
    actions = decide(book, fleet, CATALOGUE, LATER)
    assert DeclareLost("e1", NOW) in actions
    [again] = finalizes_of(actions)
    assert (again.reason, again.executor_id) == ("expired", "e2")


def test_a_resend_to_another_executor_is_a_different_message_for_the_broker() -> None:
    command = FinalizeBatch(batch_id="b1", executor_id="e1", reason="expired", owner_key_id="k",
                            input_object_key="files/f", endpoint="/v1/chat/completions")
    moved = command.model_copy(update={"executor_id": "e2"})
    assert command.msg_id != moved.msg_id
    assert command.msg_id == command.model_copy().msg_id, "a repeat to the same executor is deduplicated"


def test_while_one_executor_finalizes_another_states_nothing_and_reaches_no_object_of_the_batch() -> None:
    book = sharded_and_finished(["e1", "e2"])
    [finalize] = finalizes_of(decide(book, [advert("e1"), advert("e2"), advert("e3")], CATALOGUE, NOW, POLICY))
    book.plans["b1"].finalizer = finalize.executor_id
    done = BatchCompleted(aggregate_id="b1", output_file_id=output_file_id("b1"), error_file_id=None, completed=1000,
                          failed=0, usage=BatchUsage())
    read_input = ObjectRequest(operation="get", batch_id="b1", key="files/f")
    write_output = ObjectRequest(operation="put", batch_id="b1", key=input_object_key(output_file_id("b1")))
    assert may_state(book, "e2", done) is None and authorize(book, "e2", write_output) is None
    for other in ("e1", "e3"):  # e1 ran a shard of it; e3 is admitted and live: neither was chosen
        assert may_state(book, other, done) is not None
        assert authorize(book, other, read_input) is not None
        assert authorize(book, other, write_output) is not None
    assert may_read(book, "e3", "b1") is not None
