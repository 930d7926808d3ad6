"""A tick weighs only the batches a unit can come from: the first of each owner's queue of a lane (twice as many as
it has places to fill), urgent ones and units to retry; every other batch still counts in its owner's share through
what it runs. Its choices are exactly those of a tick that weighs every batch queued."""

import random

import pytest

from contracts.events.batch import AttemptFailed, BatchValidated, ShardFinished
from contracts.events.executor import ExecutorAdvert
from services.scheduler import decisions
from services.scheduler.actions import Action, Policy
from services.scheduler.book import Book
from services.scheduler.decisions import decide
from services.scheduler.fair_share import Weights
from tests.factories import batch_created
from tests.unit.scheduler.test_scheduler_decisions import CATALOGUE, NOW, advert
from tests.unit.scheduler.test_scheduler_units import apply_assignments

Scenario = tuple[Book, list[ExecutorAdvert], dict[str, float], Policy]


def busy_book(seed: int) -> Scenario:
    """Queues of a few owners (some in organisations, some weighted), batches of one or several units with near and
    far deadlines, units running, finished and to retry (cut by a policy of other unit sizes than the tick's), a fleet
    whose places and guest places changed since; the fleet's measured rate, if any."""
    rng = random.Random(seed)
    earlier = Policy(unit_min_lines=rng.choice([5, 50]), unit_max_lines=rng.choice([20, 100, 400]),
                     max_queued_lines=10**6)
    policy = Policy(unit_min_lines=5, unit_max_lines=rng.choice([10, 30, 100]), max_queued_lines=10**6,
                    weights=Weights(users={"key_1": rng.choice([1.0, 3.0])},
                                    organizations={"org_a": rng.choice([0.5, 1.0, 2.0])}))
    book = Book(admitted={"e1", "e2", "e3"}, known_executors=dict.fromkeys(("e1", "e2", "e3"), NOW))
    owners = rng.randint(1, 5)
    for n in range(rng.randint(40, 240)):
        owner = f"key_{rng.randint(0, owners)}"
        expires = NOW // 1000 + rng.choice([30, 120, 600, 3600, 86_400])
        organization = {"key_0": "org_a", "key_1": "org_a", "key_2": "org_b"}.get(owner)
        book.apply(batch_created(f"b{n}", owner, f"files/f{n}", created_at=0, expires_at=expires,
                                 organization_id=organization))
        book.apply(BatchValidated(aggregate_id=f"b{n}", total_lines=rng.choice([1, 3, 3, 40, 260, 700]), model="m"))
    fleet = [advert(f"e{n}", parallel=rng.randint(1, 4)).model_copy(update={"guest_attempts": rng.randint(0, 3)})
             for n in (1, 2, 3)]
    for _ in range(rng.randint(0, 5)):
        for assign in apply_assignments(book, decide(book, fleet, CATALOGUE, NOW, earlier)):
            outcome = rng.random()
            if outcome < 0.3:
                book.apply(AttemptFailed(aggregate_id=assign.plan.batch_id, attempt=assign.attempt,
                                         executor_id=assign.executor_id, code="executor_lost", reason="x"))
            elif outcome < 0.7:
                book.apply(ShardFinished(aggregate_id=assign.plan.batch_id, attempt=assign.attempt,
                                         shard=assign.shard, executor_id=assign.executor_id))
    fleet = [advert.model_copy(update={"parallel_attempts": rng.randint(1, 6), "guest_attempts": rng.randint(0, 3)})
             for advert in fleet]
    return book, fleet, {"m": rng.choice([0.0, 0.5, 2.0, 20.0])}, policy


@pytest.mark.parametrize("seed", range(150))
def test_a_tick_decides_as_a_tick_weighing_every_queued_batch_would(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    book, fleet, rates, policy = busy_book(seed)
    reached: list[Action] = decide(book, fleet, CATALOGUE, NOW, policy, rates)
    monkeypatch.setattr(decisions, "_contenders", lambda wanting, *_: wanting)
    weighed_all: list[Action] = decide(book, fleet, CATALOGUE, NOW, policy, rates)
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
    for seed in range(150):
        book, fleet, rates, policy = busy_book(seed)
        passed.clear()
        actions = decide(book, fleet, CATALOGUE, NOW, policy, rates)
        handed += any(type(action).__name__ == "Assign" for action in actions) and bool(passed) and passed[0] > 0
    assert handed >= 40
