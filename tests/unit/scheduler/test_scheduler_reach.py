"""A tick weighs only the batches a unit can come from: the first of each owner's queue of a lane (twice as many as
it has places to fill), urgent ones and units to retry; every other batch still counts in its owner's share through
what it runs. Its choices are exactly those of a tick that weighs every batch queued."""

import random

import pytest

from contracts.events.batch import AttemptFailed, BatchValidated, ShardFinished
from contracts.events.executor import ExecutorAdvert
from services.scheduler import decisions
from services.scheduler.actions import Action
from services.scheduler.book import Book
from services.scheduler.decisions import decide
from tests.factories import batch_created
from tests.unit.scheduler.test_scheduler_decisions import CATALOGUE, NOW, advert
from tests.unit.scheduler.test_scheduler_units import POLICY, apply_assignments

Scenario = tuple[Book, list[ExecutorAdvert], dict[str, float]]


def busy_book(seed: int) -> Scenario:
    """Long queues of a few owners (some in organisations), batches of one or several units with near and far
    deadlines, some units running, some finished, some to retry; the fleet's measured rate, if any."""
    rng = random.Random(seed)
    book = Book(admitted={"e1", "e2"}, known_executors={"e1": NOW, "e2": NOW})
    for n in range(rng.randint(60, 240)):
        owner = f"key_{rng.randint(0, 3)}"
        expires = NOW // 1000 + rng.choice([30, 600, 3600, 86_400])
        organization = {"key_0": "org_a", "key_1": "org_a"}.get(owner)
        book.apply(batch_created(f"b{n}", owner, f"files/f{n}", created_at=0, expires_at=expires,
                                 organization_id=organization))
        book.apply(BatchValidated(aggregate_id=f"b{n}", total_lines=rng.choice([3, 3, 40, 260]), model="m"))
    fleet = [advert("e1", parallel=rng.randint(1, 5)), advert("e2", parallel=rng.randint(1, 5))]
    for _ in range(rng.randint(1, 4)):
        for assign in apply_assignments(book, decide(book, fleet, CATALOGUE, NOW, POLICY)):
            outcome = rng.random()
            if outcome < 0.2:
                book.apply(AttemptFailed(aggregate_id=assign.plan.batch_id, attempt=assign.attempt,
                                         executor_id=assign.executor_id, code="executor_lost", reason="x"))
            elif outcome < 0.6:
                book.apply(ShardFinished(aggregate_id=assign.plan.batch_id, attempt=assign.attempt,
                                         shard=assign.shard, executor_id=assign.executor_id))
    return book, fleet, {"m": rng.choice([0.0, 0.5, 20.0])}


@pytest.mark.parametrize("seed", range(40))
def test_a_tick_decides_as_a_tick_weighing_every_queued_batch_would(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    book, fleet, rates = busy_book(seed)
    reached: list[Action] = decide(book, fleet, CATALOGUE, NOW, POLICY, rates)
    monkeypatch.setattr(decisions, "_contenders", lambda wanting, *_: wanting)
    weighed_all: list[Action] = decide(book, fleet, CATALOGUE, NOW, POLICY, rates)
    assert reached == weighed_all


def test_most_scenarios_queue_past_the_reach_and_some_hand_out_units(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison above means something: many of its ticks pass batches over and hand out units."""
    passed: list[int] = []
    contenders = decisions._contenders

    def counted(wanting: list[tuple[object, object]], *rest: object) -> object:
        chosen = contenders(wanting, *rest)  # type: ignore[arg-type]
        passed.append(len(wanting) - len(chosen))
        return chosen

    monkeypatch.setattr(decisions, "_contenders", counted)
    handed = 0
    for seed in range(40):
        book, fleet, rates = busy_book(seed)
        passed.clear()
        actions = decide(book, fleet, CATALOGUE, NOW, POLICY, rates)
        handed += any(type(action).__name__ == "Assign" for action in actions) and bool(passed) and passed[0] > 0
    assert handed >= 10
