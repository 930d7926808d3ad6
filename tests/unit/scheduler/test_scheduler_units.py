"""Batches run as units of consecutive lines spread over every able executor: the unit layout, spreading, joining
mid-batch, loss of only the units in flight, retries elsewhere, the attempt limit, cancel, the queued-lines limit."""

from collections import Counter
from collections.abc import Sequence

from contracts.events.batch import (
    AttemptFailed,
    BatchAssigned,
    BatchCancelRequested,
    BatchValidated,
    ShardFinished,
    ShardLayout,
)
from services.scheduler.book import CONTROL_PLANE, Book
from services.scheduler.decisions import (
    Assign,
    DeclareLost,
    FenceAttempt,
    Finalize,
    Policy,
    decide,
)
from services.scheduler.domain import HEARTBEAT_FRESH_MS
from services.scheduler.fleet_view import unit_layout
from tests.factories import batch_created
from tests.unit.scheduler.test_scheduler_decisions import CATALOGUE, NOW, advert

POLICY = Policy(unit_min_lines=50, unit_max_lines=100, max_queued_lines=10_000)


def book_with(batch: str, lines: int, owner: str = "k", book: Book | None = None) -> Book:
    book = book or Book(admitted={"e1", "e2", "e3", "e4"},
                        known_executors=dict.fromkeys(("e1", "e2", "e3", "e4"), NOW))
    book.apply(batch_created(batch, owner, "files/f", created_at=0, expires_at=NOW // 1000 + 3600))
    book.apply(BatchValidated(aggregate_id=batch, total_lines=lines, model="m"))
    return book


def apply_assignments(book: Book, actions: Sequence[object]) -> list[Assign]:
    assigns = [action for action in actions if isinstance(action, Assign)]
    for action in assigns:
        book.apply(BatchAssigned(aggregate_id=action.plan.batch_id, executor_id=action.executor_id,
                                 attempt=action.attempt, lease_token="t", shard=action.shard,
                                 shards=action.layout.shards, shard_span=action.layout.span, occurred_at=NOW))
    return assigns


def test_a_large_batch_is_cut_into_units_spread_round_robin_over_the_executors() -> None:
    book = book_with("b1", 1000)
    fleet = [advert("e1", parallel=2), advert("e2", parallel=2), advert("e3", parallel=2)]
    assigns = apply_assignments(book, decide(book, fleet, CATALOGUE, NOW, POLICY))
    assert [(a.shard, a.attempt) for a in assigns] == [(n, n + 1) for n in range(6)]
    assert Counter(a.executor_id for a in assigns) == {"e1": 2, "e2": 2, "e3": 2}
    assert [a.executor_id for a in assigns[:3]] != [assigns[0].executor_id] * 3, "round-robin, not one by one"
    layout = assigns[0].layout
    assert (layout.shards, layout.span) == (12, 84)
    assert decide(book, fleet, CATALOGUE, NOW, POLICY) == [], "every place is taken"


def test_a_batch_of_at_most_the_unit_minimum_runs_as_one_unit() -> None:
    book = book_with("b1", 50)
    [assign] = apply_assignments(book, decide(book, [advert("e1"), advert("e2")], CATALOGUE, NOW, POLICY))
    assert (assign.shard, assign.layout) == (0, ShardLayout())


def test_an_executor_that_joins_mid_batch_takes_the_units_left() -> None:
    book = book_with("b1", 1000)
    first = apply_assignments(book, decide(book, [advert("e1", parallel=2)], CATALOGUE, NOW, POLICY))
    assert [a.shard for a in first] == [0, 1]
    book.admitted.add("e5")
    book.known_executors["e5"] = NOW
    joined = apply_assignments(book, decide(book, [advert("e1", parallel=2), advert("e5", parallel=3)], CATALOGUE,
                                            NOW, POLICY))
    assert [(a.executor_id, a.shard) for a in joined] == [("e5", 2), ("e5", 3), ("e5", 4)]


def test_once_every_unit_finished_the_batch_is_finalized_once() -> None:
    book = book_with("b1", 120)
    fleet = [advert("e1"), advert("e2")]
    assigns = apply_assignments(book, decide(book, fleet, CATALOGUE, NOW, POLICY))
    assert len(assigns) == assigns[0].layout.shards == 3
    for assign in assigns[:-1]:
        book.apply(ShardFinished(aggregate_id="b1", attempt=assign.attempt, shard=assign.shard,
                                 executor_id=assign.executor_id))
        assert decide(book, fleet, CATALOGUE, NOW, POLICY) == []
    last = assigns[-1]
    book.apply(ShardFinished(aggregate_id="b1", attempt=last.attempt, shard=last.shard, executor_id=last.executor_id))
    [finalize] = decide(book, fleet, CATALOGUE, NOW, POLICY)
    assert isinstance(finalize, Finalize) and finalize.reason == "completed"
    assert finalize.executor_id is None  # its units ran on e1 and e2: neither writes the other's lines
    book.plans["b1"].finalizer = CONTROL_PLANE
    assert decide(book, fleet, CATALOGUE, NOW, POLICY) == []


def test_a_lost_executor_loses_only_its_units_which_run_again_elsewhere_before_fresh_ones() -> None:
    book = book_with("b1", 1000)
    assigns = apply_assignments(book, decide(book, [advert("e1", parallel=2), advert("e2", parallel=2)],
                                             CATALOGUE, NOW, POLICY))
    lost = [a for a in assigns if a.executor_id == "e2"]
    now = NOW + HEARTBEAT_FRESH_MS + 1
    fleet = [advert("e1", heartbeat_at=now, parallel=2)]
    book.note_heartbeats(fleet)
    fences = [a for a in decide(book, fleet, CATALOGUE, now, POLICY) if not isinstance(a, DeclareLost)]
    assert [(type(a), getattr(a, "attempt", None)) for a in fences] == [(FenceAttempt, a.attempt) for a in lost]
    for unit in lost:
        book.apply(AttemptFailed(aggregate_id="b1", attempt=unit.attempt, executor_id="e2", code="executor_lost",
                                 reason="x"))
    book.admitted.add("e3")
    book.known_executors["e3"] = now
    fleet.append(advert("e3", heartbeat_at=now, parallel=3))
    again = apply_assignments(book, decide(book, fleet, CATALOGUE, now, POLICY))
    assert [(a.executor_id, a.shard) for a in again] == [("e3", lost[0].shard), ("e3", lost[1].shard), ("e3", 4)]
    assert {a.layout for a in again} == {assigns[0].layout}
    assert all(book.plans["b1"].shard(a.shard).running for a in assigns if a.executor_id == "e1")


def test_a_failed_unit_runs_again_on_an_executor_that_has_not_tried_it() -> None:
    book = book_with("b1", 1000)
    fleet = [advert("e1", parallel=2), advert("e2", parallel=2)]
    [first, *_] = apply_assignments(book, decide(book, fleet, CATALOGUE, NOW, POLICY))
    book.apply(AttemptFailed(aggregate_id="b1", attempt=first.attempt, executor_id=first.executor_id,
                             code="engine_crashed", reason="x"))
    other = next(executor_id for executor_id in assigns_of(book) if executor_id != first.executor_id)
    book.apply(ShardFinished(aggregate_id="b1", attempt=book.plans["b1"].shard(1).attempt, shard=1,
                             executor_id=other))
    assigned = apply_assignments(book, decide(book, fleet, CATALOGUE, NOW, POLICY))
    assert (first.shard, other) in [(a.shard, a.executor_id) for a in assigned]


def assigns_of(book: Book) -> list[str]:
    return [run.executor_id for _, run in book.plans["b1"].running_shards() if run.executor_id is not None]


def test_a_unit_that_fails_three_times_stops_the_others_and_finalizes_the_batch_as_failed() -> None:
    book = book_with("b1", 1000)
    fleet = [advert("e1", parallel=1), advert("e2", parallel=1)]
    apply_assignments(book, decide(book, fleet, CATALOGUE, NOW, POLICY))
    for _ in range(3):
        run = book.plans["b1"].shard(1)
        book.apply(AttemptFailed(aggregate_id="b1", attempt=run.attempt, executor_id=run.executor_id or "",
                                 code="engine_crashed", reason="x"))
        apply_assignments(book, decide(book, fleet, CATALOGUE, NOW, POLICY))
    actions = decide(book, fleet, CATALOGUE, NOW, POLICY)
    assert [(type(a), getattr(a, "code", None) or getattr(a, "failure_code", None)) for a in actions] == [
        (FenceAttempt, "attempts_exhausted"), (Finalize, "attempts_exhausted")]
    assert isinstance(actions[0], FenceAttempt) and book.plans["b1"].attempt_shard[actions[0].attempt] == 0


def test_a_cancelled_batch_waits_for_its_units_to_stop_then_is_finalized() -> None:
    book = book_with("b1", 1000)
    fleet = [advert("e1", parallel=2), advert("e2", parallel=2)]
    assigns = apply_assignments(book, decide(book, fleet, CATALOGUE, NOW, POLICY))
    book.apply(BatchCancelRequested(aggregate_id="b1", requested_by_key_id="k", occurred_at=NOW))
    assert decide(book, fleet, CATALOGUE, NOW + 1000, POLICY) == [], "no new unit; the running ones wind down"
    for assign in assigns:
        book.apply(ShardFinished(aggregate_id="b1", attempt=assign.attempt, shard=assign.shard,
                                 executor_id=assign.executor_id, stopped=True))
    [finalize] = decide(book, fleet, CATALOGUE, NOW + 2000, POLICY)
    assert isinstance(finalize, Finalize) and finalize.reason == "cancelled"


def test_a_batch_past_its_owners_queued_lines_limit_fails_and_other_owners_are_not_affected() -> None:
    book = book_with("first", 6000)
    book = book_with("second", 6000, book=book)
    book = book_with("other", 6000, owner="someone-else", book=book)
    actions = decide(book, [], CATALOGUE, NOW, POLICY)
    # Finalized as failed by the control plane: every one of its lines goes to the error file.
    failed = [(a.plan.batch_id, a.reason, a.failure_code, a.executor_id) for a in actions if isinstance(a, Finalize)]
    assert failed == [("second", "failed", "enqueued_request_limit_exceeded", None)]


def test_units_cover_every_line_exactly_once_within_the_size_bounds() -> None:
    for total, able in ((1000, 3), (10, 4), (51, 1), (5000, 1), (100_000, 7), (1, 3)):
        layout = unit_layout(total, able, POLICY)
        owners = [layout.shard_of(line) for line in range(1, total + 1)]
        for line, unit in zip(range(1, total + 1), owners, strict=True):
            last = layout.last_line(unit)
            assert layout.first_line(unit) <= line and (last is None or line <= last)
        assert sorted(set(owners)) == list(range(layout.shards))
        assert layout.shards == 1 or layout.span <= POLICY.unit_max_lines


def test_attempts_that_committed_lines_before_dying_do_not_count_against_the_attempt_limit() -> None:
    from contracts.events.batch import BatchProgressed

    book = book_with("b1", 50)
    fleet = [advert("e1"), advert("e2")]
    for _ in range(4):
        [assign] = apply_assignments(book, decide(book, fleet, CATALOGUE, NOW, POLICY))
        book.apply(BatchProgressed(aggregate_id="b1", attempt=assign.attempt, chunk=0, chunk_key="k", completed=1,
                                   failed=0))
        book.apply(AttemptFailed(aggregate_id="b1", attempt=assign.attempt, executor_id=assign.executor_id,
                                 code="executor_lost", reason="x"))
    assert [type(a) for a in decide(book, fleet, CATALOGUE, NOW, POLICY)] == [Assign]
