"""A batch's standing as its owner reads it: the fleet's measured rate per model, the queued and running texts,
and how seldom they change."""

import pytest

from services.scheduler.fair_share import QueuedBatch, standings
from services.scheduler.standing import (
    ETA_ONLY_EVERY_MS,
    FAR_PLACE_EVERY_MS,
    REPUBLISH_EVERY_MS,
    RateMeter,
    eta_phrase,
    ordinal,
    place_phrase,
    queued_reason,
    running_reason,
    should_republish,
)

MODEL = "smollm2-135m-instruct-q4_1"
T0 = 1_700_000_000_000


def test_the_rate_is_the_lines_committed_over_the_last_minute() -> None:
    meter = RateMeter()
    for second in range(60):
        meter.note(MODEL, T0 + second * 1000, 5)
    assert meter.rates(T0 + 60_000) == {MODEL: pytest.approx(5.0, rel=0.1)}


def test_each_model_has_its_own_rate_and_a_model_never_run_has_none() -> None:
    meter = RateMeter()
    for second in range(30):
        meter.note("a", T0 + second * 1000, 2)
        meter.note("b", T0 + second * 1000, 8)
    rates = meter.rates(T0 + 30_000)
    assert rates["b"] == pytest.approx(4 * rates["a"])
    assert "c" not in rates


def test_a_fleet_that_just_began_is_measured_over_the_time_it_ran_not_the_whole_window() -> None:
    meter = RateMeter()
    for second in range(10):
        meter.note(MODEL, T0 + second * 1000, 10)
    assert meter.rates(T0 + 10_000)[MODEL] == pytest.approx(10.0, rel=0.5)


def test_lines_older_than_the_window_no_longer_count() -> None:
    meter = RateMeter()
    meter.note(MODEL, T0, 600)
    assert MODEL in meter.rates(T0 + 30_000)
    assert meter.rates(T0 + 61_000) == {}


def test_facts_replayed_from_long_ago_at_start_up_add_nothing_and_keep_no_memory() -> None:
    meter = RateMeter()
    for hour in range(1000):  # a history replayed at start-up: a fact per hour, days old
        meter.note(MODEL, T0 + hour * 3_600_000, 1000)
    now = T0 + 2000 * 3_600_000
    assert meter.rates(now) == {}
    assert meter._lines == {}
    meter.note(MODEL, now - 500, 3)
    meter.note(MODEL, T0, 10_000)  # a straggler from long ago, after live facts
    assert meter.rates(now)[MODEL] == pytest.approx(3 / 5)


def test_memory_is_bounded_by_the_buckets_whatever_the_fact_rate() -> None:
    meter = RateMeter()
    for ms in range(0, 600_000, 7):
        meter.note(MODEL, T0 + ms, 1)
    assert len(meter._lines[MODEL]) <= 13


def test_a_fact_without_new_lines_is_not_a_sign_of_activity() -> None:
    meter = RateMeter()
    meter.note(MODEL, T0, 0)
    assert meter.rates(T0 + 1000) == {}


@pytest.mark.parametrize(("n", "text"), [(1, "1st"), (2, "2nd"), (3, "3rd"), (4, "4th"), (11, "11th"),
                                         (12, "12th"), (13, "13th"), (21, "21st"), (22, "22nd"), (23, "23rd"),
                                         (101, "101st"), (111, "111th"), (112, "112th"), (1001, "1,001st")])
def test_ordinals(n: int, text: str) -> None:
    assert ordinal(n) == text


@pytest.mark.parametrize(("position", "text"), [(1, "1st"), (3, "3rd"), (10, "10th"), (11, "about 10th"),
                                                (38, "about 40th"), (42, "about 40th"), (95, "about 100th"),
                                                (312, "about 300th"), (9_640, "about 10,000th")])
def test_the_place_is_exact_near_the_front_and_rounded_beyond(position: int, text: str) -> None:
    assert place_phrase(position) == text


def test_ten_thousand_queued_batches_see_few_distinct_places() -> None:
    assert len({place_phrase(position) for position in range(1, 10_001)}) < 40


@pytest.mark.parametrize(("eta_s", "text"), [(0, "under a minute"), (59, "under a minute"), (60, "about 1 min"),
                                             (150, "about 3 min"), (599, "about 10 min"), (700, "about 10 min"),
                                             (900, "about 15 min"), (1300, "about 20 min"), (1900, "about 30 min"),
                                             (2700, "about 45 min"), (3300, "about 1 h"), (5000, "about 1 h"),
                                             (3 * 3600 + 600, "about 3 h"), (100 * 3600, "about 4 days"),
                                             (None, None), (float("inf"), None), (-1, None)])
def test_the_eta_is_told_in_buckets_coarse_enough_to_hold_for_a_while(eta_s: float | None, text: str | None) -> None:
    assert eta_phrase(eta_s) == text


def test_a_queued_batch_says_its_place_for_its_model_and_when_it_should_be_done() -> None:
    assert queued_reason(3, MODEL, 230) == f"Queued: 3rd for {MODEL}, about 4 min."
    assert queued_reason(42, MODEL, 30) == f"Queued: about 40th for {MODEL}, under a minute."


def test_without_a_measured_rate_a_queued_batch_says_no_eta() -> None:
    assert queued_reason(3, MODEL, None) == f"Queued: 3rd for {MODEL}."


def test_a_running_batch_says_on_how_many_executors_how_far_it_is_and_how_long_is_left() -> None:
    assert running_reason(40, 100, 170, 2) == "Running on 2 executors: 40 % done, about 3 min left."
    assert running_reason(1, 3, 20, 1) == "Running on 1 executor: 33 % done, under a minute left."
    assert running_reason(5, 10, None, 0) == "Running: 50 % done."


def test_a_running_batch_is_never_100_percent_done_before_its_last_line() -> None:
    assert running_reason(999, 1000, 1, 1).startswith("Running on 1 executor: 99 % done")
    assert running_reason(1000, 1000, 0, 1).startswith("Running on 1 executor: 100 % done")


def test_standings_from_a_measured_rate_become_the_texts_owners_read() -> None:
    meter = RateMeter()
    for second in range(60):
        meter.note(MODEL, T0 + second * 1000, 2)  # the fleet runs 2 lines a second
    queued = [QueuedBatch(f"b{n}", f"user{n}", None, MODEL, n, T0 + 86_400_000, 120, 120) for n in range(1, 4)]
    places = standings(queued, meter.rates(T0 + 60_000))
    # Three owners share the fleet equally: all three finish their 120 lines together, after 360 lines.
    assert [queued_reason(places[b.batch_id].position, MODEL, places[b.batch_id].eta_s) for b in queued] == [
        f"Queued: 1st for {MODEL}, about 3 min.", f"Queued: 2nd for {MODEL}, about 3 min.",
        f"Queued: 3rd for {MODEL}, about 3 min."]


def test_the_same_text_is_never_stated_twice() -> None:
    text = queued_reason(3, MODEL, 230)
    assert not should_republish(text, text, T0, T0 + 3_600_000)


def test_the_first_standing_and_a_change_of_kind_are_stated_at_once() -> None:
    queued, running = queued_reason(1, MODEL, 30), running_reason(0, 10, 30, 1)
    assert should_republish(None, queued, None, T0)
    assert should_republish(queued, running, T0, T0 + 1)
    assert should_republish("no executor serves the model", queued, T0, T0 + 1)


def test_a_new_place_waits_ten_seconds_after_the_last_text() -> None:
    old, new = queued_reason(4, MODEL, 300), queued_reason(3, MODEL, 300)
    assert not should_republish(old, new, T0, T0 + REPUBLISH_EVERY_MS - 1)
    assert should_republish(old, new, T0, T0 + REPUBLISH_EVERY_MS)


def test_progress_of_a_running_batch_waits_ten_seconds_too() -> None:
    old, new = running_reason(40, 100, 170, 2), running_reason(45, 100, 170, 2)
    assert not should_republish(old, new, T0, T0 + 5_000)
    assert should_republish(old, new, T0, T0 + REPUBLISH_EVERY_MS)


def test_a_new_eta_alone_waits_longer_so_a_rate_at_a_buckets_edge_does_not_flip_it_every_tick() -> None:
    old, new = queued_reason(3, MODEL, 200), queued_reason(3, MODEL, 250)
    assert old != new
    assert not should_republish(old, new, T0, T0 + REPUBLISH_EVERY_MS)
    assert should_republish(old, new, T0, T0 + ETA_ONLY_EVERY_MS)
    assert not should_republish(queued_reason(3, MODEL, None), queued_reason(3, MODEL, 250), T0, T0 + 1000)


def test_a_new_place_far_back_in_the_queue_waits_as_long_as_a_new_eta() -> None:
    old, new = queued_reason(300, MODEL, 3000), queued_reason(200, MODEL, 3000)
    assert old != new
    assert not should_republish(old, new, T0, T0 + FAR_PLACE_EVERY_MS - 1)
    assert should_republish(old, new, T0, T0 + FAR_PLACE_EVERY_MS)
    assert should_republish(queued_reason(300, MODEL, 3000), queued_reason(9, MODEL, 3000), T0, T0 + REPUBLISH_EVERY_MS)
