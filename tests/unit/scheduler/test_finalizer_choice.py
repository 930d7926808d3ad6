"""Who finalizes a batch: the executor holding the lease of every unit of it, when it is live; else the control plane
itself. No executor that did not run it all may state its end or reach its objects."""

from collections.abc import Sequence

from contracts.commands import FinalizeBatch
from contracts.events.batch import (
    AttemptFailed,
    BatchAssigned,
    BatchCancelRequested,
    BatchCompleted,
    BatchUsage,
    ShardFinished,
)
from contracts.ids import output_file_id
from contracts.objects import ObjectRequest
from contracts.subjects import input_object_key
from contracts.terms import BatchTerms
from services.scheduler.book import CONTROL_PLANE, Book
from services.scheduler.decisions import Action, DeclareLost, Finalize, decide
from services.scheduler.domain import HEARTBEAT_FRESH_MS
from services.scheduler.entitlements import may_read, may_state
from services.scheduler.objects import authorize
from tests.unit.scheduler.test_scheduler_decisions import CATALOGUE, NOW, advert, assign, validated_book
from tests.unit.scheduler.test_scheduler_units import POLICY, apply_assignments, book_with

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


def sharded_on_one(executor: str) -> Book:
    """b1 ran as two units, both on `executor` (attempts 1 and 2); both finished."""
    book = book_with("b1", 100)
    for attempt, shard in ((1, 0), (2, 1)):
        book.apply(BatchAssigned(aggregate_id="b1", executor_id=executor, attempt=attempt, lease_token="t",
                                 shard=shard, shards=2, shard_span=50))
        book.apply(ShardFinished(aggregate_id="b1", attempt=attempt, shard=shard, executor_id=executor))
    return book


def test_the_executor_that_ran_every_unit_finalizes_the_batch() -> None:
    book = sharded_on_one("e1")
    [finalize] = finalizes_of(decide(book, [advert("e1"), advert("e2")], CATALOGUE, NOW, POLICY))
    assert (finalize.reason, finalize.executor_id) == ("completed", "e1")


def test_units_that_ran_on_several_executors_are_finalized_by_the_control_plane() -> None:
    book = sharded_and_finished(["e1", "e2"])
    assert book.plans["b1"].assignees == {1: "e1", 2: "e2"}
    [finalize] = finalizes_of(decide(book, [advert("e1"), advert("e2"), advert("e3")], CATALOGUE, NOW, POLICY))
    assert (finalize.reason, finalize.executor_id) == ("completed", None)


def test_a_batch_that_never_ran_is_finalized_by_the_control_plane_whoever_is_live() -> None:
    book = validated_book()
    book.apply(BatchCancelRequested(aggregate_id="b1", requested_by_key_id="k", occurred_at=NOW))
    for fleet in ([advert("e3"), advert("e2")], []):
        [finalize] = finalizes_of(decide(book, fleet, CATALOGUE, NOW))
        assert (finalize.reason, finalize.executor_id) == ("cancelled", None)
    book.plans["b1"].finalizer = CONTROL_PLANE
    assert finalizes_of(decide(book, [advert("e2")], CATALOGUE, NOW)) == [], "once, while the control plane is at it"


def test_a_fenced_attempts_executor_does_not_finalize_the_batch() -> None:
    book = validated_book(expires_at=NOW // 1000 - 1)
    assign(book, "e1", 1)
    book.apply(AttemptFailed(aggregate_id="b1", attempt=1, executor_id="e1", code="batch_expired", reason="x"))
    [finalize] = finalizes_of(decide(book, [advert("e1"), advert("e2")], CATALOGUE, NOW))
    assert (finalize.reason, finalize.executor_id) == ("expired", None)


def test_a_finalizer_that_goes_silent_leaves_the_batch_to_the_control_plane() -> None:
    book = sharded_on_one("e1")
    [first] = finalizes_of(decide(book, [advert("e1"), advert("e2")], CATALOGUE, NOW, POLICY))
    assert first.executor_id == "e1"
    book.plans["b1"].finalizer = first.executor_id
    assert finalizes_of(decide(book, [advert("e1"), advert("e2")], CATALOGUE, NOW + 1000, POLICY)) == []
    assert finalizes_of(decide(book, [advert("e2")], CATALOGUE, NOW + 1000, POLICY)) == [], "one scan missing it"

    actions = decide(book, [advert("e2", heartbeat_at=LATER)], CATALOGUE, LATER, POLICY)
    assert DeclareLost("e1", NOW) in actions
    [again] = finalizes_of(actions)
    assert (again.reason, again.executor_id) == ("completed", None)


def test_a_resend_to_another_executor_is_a_different_message_for_the_broker() -> None:
    command = FinalizeBatch(batch_id="b1", executor_id="e1", reason="expired",
                            terms=BatchTerms(owner_key_id="k", endpoint="/v1/chat/completions",
                                             input_object_key="files/f"))
    moved = command.model_copy(update={"executor_id": "e2"})
    assert command.msg_id != moved.msg_id
    assert command.msg_id == command.model_copy().msg_id, "a repeat to the same executor is deduplicated"


def test_while_the_control_plane_finalizes_no_executor_states_its_end_or_reaches_its_objects() -> None:
    book = sharded_and_finished(["e1", "e2"])
    [finalize] = finalizes_of(decide(book, [advert("e1"), advert("e2"), advert("e3")], CATALOGUE, NOW, POLICY))
    assert finalize.executor_id is None
    book.plans["b1"].finalizer = CONTROL_PLANE
    done = BatchCompleted(aggregate_id="b1", output_file_id=output_file_id("b1"), error_file_id=None, completed=100,
                          failed=0, usage=BatchUsage())
    read_input = ObjectRequest(operation="get", batch_id="b1", key="files/f")
    write_output = ObjectRequest(operation="put", batch_id="b1", key=input_object_key(output_file_id("b1")))
    for executor in ("e1", "e2", "e3"):  # e1 and e2 ran a unit each; e3 is admitted and live
        assert may_state(book, executor, done) is not None
        assert authorize(book, executor, read_input) is not None
        assert authorize(book, executor, write_output) is not None
    assert may_read(book, "e3", "b1") is not None


def test_the_chosen_executor_alone_states_the_end_and_writes_the_files() -> None:
    book = sharded_on_one("e1")
    [finalize] = finalizes_of(decide(book, [advert("e1"), advert("e3")], CATALOGUE, NOW, POLICY))
    book.plans["b1"].finalizer = finalize.executor_id
    done = BatchCompleted(aggregate_id="b1", output_file_id=output_file_id("b1"), error_file_id=None, completed=100,
                          failed=0, usage=BatchUsage())
    write_output = ObjectRequest(operation="put", batch_id="b1", key=input_object_key(output_file_id("b1")))
    assert may_state(book, "e1", done) is None and authorize(book, "e1", write_output) is None
    assert may_state(book, "e3", done) is not None and authorize(book, "e3", write_output) is not None
