"""The fair queue: shares between organisations and users, weights, FIFO within an owner, urgency near a deadline,
and the standings (queue place, ETA) it implies."""

from collections import Counter

import pytest

from services.scheduler.fair_share import FairQueue, QueuedBatch, Weights, standings

HOUR_MS = 3_600_000


def batch(batch_id: str, user: str, lines: int, order: int, org: str | None = None, model: str = "m",
          expires_at_ms: int = 24 * HOUR_MS, in_flight: int = 0) -> QueuedBatch:
    return QueuedBatch(batch_id, user, org, model, order, expires_at_ms, pending_lines=lines - in_flight,
                       remaining_lines=lines, in_flight_lines=in_flight)


def served(queue: FairQueue, units: int, unit_lines: int = 8, models: tuple[str, ...] = ("m",)) -> Counter[str]:
    """Lines handed out per user over `units` decisions."""
    lines: Counter[str] = Counter()
    for _ in range(units):
        taken = queue.take(models, unit_lines)
        if taken is None:
            break
        lines[taken[0].user] += taken[1]
    return lines


def test_three_users_share_the_fleet_equally_whatever_they_queued() -> None:
    queue = FairQueue([batch("a", "ann", 6000, 1), batch("b", "bob", 600, 2), batch("c", "cy", 600, 3)])
    assert served(queue, 30) == {"ann": 80, "bob": 80, "cy": 80}


def test_a_small_batch_behind_a_large_one_of_another_user_goes_next() -> None:
    queue = FairQueue([batch("big", "ann", 2000, 1, in_flight=64), batch("small", "bob", 1, 2)])
    taken = queue.take(["m"], 16)
    assert taken is not None and taken[0].batch_id == "small" and taken[1] == 1


def test_within_a_user_batches_run_in_validation_order() -> None:
    queue = FairQueue([batch("second", "ann", 16, 2), batch("first", "ann", 16, 1)])
    order = [taken[0].batch_id for taken in iter(lambda: queue.take(["m"], 8), None)]
    assert order == ["first", "first", "second", "second"]


def test_weights_give_proportional_shares() -> None:
    queue = FairQueue([batch("a", "ann", 9000, 1), batch("b", "bob", 9000, 2)], Weights(users={"ann": 3}))
    assert served(queue, 40) == {"ann": 240, "bob": 80}


def test_organisations_share_first_then_their_users() -> None:
    queue = FairQueue([batch("a1", "ann", 9000, 1, org="acme"), batch("a2", "al", 9000, 2, org="acme"),
                       batch("b", "bob", 9000, 3, org="beta")])
    lines = served(queue, 40)
    assert lines["bob"] == 160 and lines["ann"] == lines["al"] == 80


def test_an_owner_alone_gets_all_the_capacity() -> None:
    assert served(FairQueue([batch("a", "ann", 9000, 1)]), 10) == {"ann": 80}


def test_lines_already_in_flight_count_against_their_owner() -> None:
    queue = FairQueue([batch("a", "ann", 9000, 1, in_flight=40), batch("b", "bob", 9000, 2)])
    assert served(queue, 5) == {"bob": 40}


def test_a_batch_that_would_miss_its_deadline_is_served_first() -> None:
    now = 10 * HOUR_MS
    # 3,600 lines at 2 lines/s need 30 minutes, twice that is an hour: 50 minutes left is urgent.
    late = batch("late", "bob", 3600, 2, expires_at_ms=now + 50 * 60_000)
    relaxed = batch("relaxed", "cy", 3600, 3, expires_at_ms=now + 5 * HOUR_MS)
    queue = FairQueue([batch("a", "ann", 9000, 1), late, relaxed], rates={"m": 2.0}, now_ms=now)
    assert {queue.take(["m"], 8)[0].batch_id for _ in range(5)} == {"late"}  # type: ignore[index]


def test_an_executor_gets_only_units_of_the_models_it_serves() -> None:
    queue = FairQueue([batch("a", "ann", 100, 1, model="big"), batch("b", "bob", 100, 2, model="small")])
    taken = queue.take(["small"], 8)
    assert taken is not None and taken[0].batch_id == "b"
    assert FairQueue([batch("a", "ann", 100, 1, model="big")]).take(["small"], 8) is None


def test_a_batch_with_every_line_handed_out_gives_no_more_units() -> None:
    queue = FairQueue([batch("a", "ann", 10, 1)])
    sizes = [taken[1] for taken in iter(lambda: queue.take(["m"], 8), None)]
    assert sizes == [8, 2]


def test_standings_put_a_small_batch_ahead_of_a_big_one_queued_earlier() -> None:
    found = standings([batch("big", "ann", 2000, 1), batch("small", "bob", 10, 2)], {"m": 10.0})
    assert found["small"].position == 1 and found["big"].position == 2
    # Sharing the rate equally, the small batch ends after 20 lines of work (2 s), the big one after all 2,010.
    assert found["small"].eta_s == pytest.approx(2.0)
    assert found["big"].eta_s == pytest.approx(201.0)


def test_standings_without_a_measured_rate_give_places_but_no_eta() -> None:
    found = standings([batch("a", "ann", 10, 1), batch("b", "ann", 10, 2)], {})
    assert [found["a"].position, found["b"].position] == [1, 2] and found["a"].eta_s is None
