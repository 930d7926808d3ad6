"""`sheshnag batch`'s live line: the batch's status and request counts (a resumed wait replays the log and must not
count twice), the rate over the last 30 s of event time, and an ETA only with enough samples, a rate, in_progress."""

import io
from typing import Any

from infra.batch_progress import Progress, RateWindow, status_after

T0 = 1_800_000_000.0
LATENCY = 0.05


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def fact(kind: str, at: float, **fields: Any) -> dict[str, Any]:
    return {"type": f"batch.{kind}", "batch_id": "batch_1", "occurred_at": int(at * 1000), **fields}


def live(progress: Progress, clock: Clock, kind: str, at: float, **fields: Any) -> None:
    """The fact arrives as it happens."""
    clock.now = at + LATENCY
    progress.take(fact(kind, at, **fields))


def running(total: int = 40) -> tuple[Progress, Clock]:
    clock = Clock(T0)
    progress = Progress(io.StringIO(), clock)
    live(progress, clock, "created", T0)
    live(progress, clock, "validated", T0 + 1, total_lines=total)
    live(progress, clock, "assigned", T0 + 1, shard=0, shards=2)
    live(progress, clock, "started", T0 + 2)
    return progress, clock


def test_the_live_line_shows_the_batch_status_not_the_last_fact_s_type() -> None:
    progress, clock = running()
    live(progress, clock, "waiting", T0 + 3, reason="Running on 1 executor: 0 % done.")
    live(progress, clock, "progressed", T0 + 4, shard=0, completed=20, failed=0)
    live(progress, clock, "shard_finished", T0 + 5, shard=0, stopped=False)
    assert progress.status == "in_progress"
    assert " in_progress" in progress.line() and "waiting" not in progress.line()
    assert "shard_finished" not in progress.line()


def test_a_queued_batch_shows_validated_and_why_it_waits() -> None:
    clock = Clock(T0)
    progress = Progress(io.StringIO(), clock)
    live(progress, clock, "validated", T0, total_lines=12)
    live(progress, clock, "waiting", T0 + 1, reason="Queued: 3rd for smollm2-135m-instruct-q4_1, about 4 min.")
    assert progress.line().endswith("0/12 lines (0 failed) validated: Queued: 3rd for smollm2-135m-instruct-q4_1, "
                                    "about 4 min.")


def test_statuses_fold_as_the_ledger_folds_them() -> None:
    assert status_after("batch.started", "validated") == "in_progress"
    assert status_after("batch.started", "cancelling") == "cancelling"
    assert status_after("batch.progressed", "cancelling") == "cancelling"
    assert status_after("batch.attempt_failed", "in_progress") == "in_progress"
    assert status_after("batch.validation_failed", "validating") == "failed"
    assert status_after("batch.cancel_requested", "in_progress") == "cancelling"


def test_a_resumed_wait_counts_each_line_once_and_at_the_rate_it_ran() -> None:
    clock = Clock(T0 + 20 + LATENCY)
    progress = Progress(io.StringIO(), clock)
    progress.take_batch({"status": "in_progress", "request_counts": {"total": 40, "completed": 8, "failed": 0}})
    # The log replayed from its start, every fact arriving at once, long after most happened.
    for event in (fact("created", T0 - 5), fact("validated", T0 - 4, total_lines=40), fact("started", T0),
                  fact("progressed", T0 + 10, shard=0, completed=5, failed=0),
                  fact("progressed", T0 + 20, shard=1, completed=3, failed=0)):
        progress.take(event)
    line = progress.line()
    assert "8/40 lines (0 failed) in_progress" in line, line
    assert ", 0.4 lines/s, ETA 1:20" in line, line  # 8 lines in 20 s; 32 left


def test_the_rate_is_measured_over_the_last_30_seconds() -> None:
    progress, clock = running(total=200)
    live(progress, clock, "progressed", T0 + 5, shard=0, completed=100, failed=0)  # a fast start
    for step in range(1, 7):  # then a line every 10 s
        live(progress, clock, "progressed", T0 + 5 + 10 * step, shard=0, completed=100 + step, failed=0)
    assert ", 0.1 lines/s, ETA 15:40" in progress.line(), progress.line()  # 3 lines in 30 s; 94 left


def test_no_eta_before_three_samples_in_the_window() -> None:
    progress, clock = running()
    live(progress, clock, "progressed", T0 + 4, shard=0, completed=4, failed=0)
    assert progress.line().endswith("in_progress, 2.0 lines/s"), progress.line()
    live(progress, clock, "progressed", T0 + 6, shard=0, completed=8, failed=0)
    assert progress.line().endswith("in_progress, 2.0 lines/s, ETA 0:16"), progress.line()


def test_no_rate_and_no_eta_once_nothing_moved_for_the_whole_window() -> None:
    progress, clock = running()
    live(progress, clock, "progressed", T0 + 4, shard=0, completed=4, failed=0)
    live(progress, clock, "progressed", T0 + 6, shard=0, completed=8, failed=0)
    clock.now += 60
    assert progress.line().endswith("8/40 lines (0 failed) in_progress"), progress.line()


def test_no_eta_when_the_rate_is_zero() -> None:
    progress, clock = running()
    for second in (4, 6, 8):
        live(progress, clock, "progressed", T0 + second, shard=0, completed=0, failed=0)
    assert progress.line().endswith("in_progress, 0.0 lines/s"), progress.line()


def test_no_rate_or_eta_unless_in_progress() -> None:
    progress, clock = running()
    for second in (4, 6, 8):
        live(progress, clock, "progressed", T0 + second, shard=0, completed=second, failed=0)
    live(progress, clock, "cancel_requested", T0 + 9, code="batch_cancelled")
    assert progress.line().endswith("8/40 lines (0 failed) cancelling"), progress.line()


def test_the_end_shows_the_batch_s_own_counts() -> None:
    progress, clock = running(total=12)
    live(progress, clock, "progressed", T0 + 4, shard=0, completed=9, failed=0)
    progress.take_batch({"status": "completed", "request_counts": {"total": 12, "completed": 10, "failed": 2}},
                        final=True)
    assert progress.line().endswith("12/12 lines (2 failed) completed"), progress.line()


def test_a_fact_stamped_earlier_than_the_last_never_makes_the_rate_negative() -> None:
    window = RateWindow()
    window.add(T0, 0)
    window.add(T0 + 10, 10)
    window.add(T0 + 9, 11)  # another executor's clock, slightly behind
    rate = window.rate(T0 + 10)
    assert rate is not None and rate > 0
