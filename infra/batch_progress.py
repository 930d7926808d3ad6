"""The live line of `sheshnag batch run|wait`: the batch's status and request counts folded from its event stream
(and the batch object), the rate over a sliding window of event times, and an ETA only when it means something.

Pure: every clock is passed in, so a replayed stream (a resumed wait reads the log from its start) draws the same
counts and rate as a live one.
"""

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

BAR_WIDTH = 30
RATE_WINDOW_S = 30.0
"""The rate is measured over the facts of the last 30 s (of event time)."""
MIN_SAMPLES_FOR_RATE = 2
MIN_SAMPLES_FOR_ETA = 3
"""Progress facts inside the window before a rate (two points) or an ETA (three) is shown."""
MIN_SPAN_S = 1.0
"""A rate measured over less time than this is noise (a chunk's facts come in a burst)."""

STATUS_AFTER: Mapping[str, str] = {
    "batch.created": "validating",
    "batch.validated": "validated",
    "batch.validation_failed": "failed",
    "batch.finalizing": "finalizing",
    "batch.cancel_requested": "cancelling",
    "batch.completed": "completed",
    "batch.failed": "failed",
    "batch.cancelled": "cancelled",
    "batch.expired": "expired",
}
"""The status a fact moves the batch to, as the ledger folds it; a fact not named here (`waiting`, `assigned`,
`shard_finished`, `progressed`, …) leaves the status as it is. `started` is `status_after`'s own case."""


def status_after(kind: str, status: str) -> str:
    """The batch's status once the fact of type `kind` is folded onto `status`."""
    if kind == "batch.started":
        return "in_progress" if status in ("validated", "in_progress") else status
    return STATUS_AFTER.get(kind, status)


def clock_text(seconds: float) -> str:
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


@dataclass
class RateWindow:
    """Lines finished at each progress fact's time; the rate over the last `window_s` seconds."""

    window_s: float = RATE_WINDOW_S
    samples: deque[tuple[float, int]] = field(default_factory=deque)

    def add(self, at: float, finished: int) -> None:
        if self.samples:
            at = max(at, self.samples[-1][0])  # facts of several executors may carry slightly older times
        self.samples.append((at, finished))
        # Keep one sample from before the window: the rate's baseline.
        while len(self.samples) > 2 and self.samples[1][0] < at - self.window_s:
            self.samples.popleft()

    def inside(self, now: float) -> int:
        return sum(1 for at, _ in self.samples if at >= now - self.window_s)

    def rate(self, now: float) -> float | None:
        """Lines per second over the window ending `now`; None without enough samples to say."""
        if self.inside(now) < MIN_SAMPLES_FOR_RATE:
            return None
        start = now - self.window_s
        before = [sample for sample in self.samples if sample[0] <= start]
        base_at, base_finished = before[-1] if before else self.samples[0]
        span = now - max(start, base_at)
        if span < MIN_SPAN_S:
            return None
        # Before the window: interpolate nothing, take the count as it stood at the window's start.
        return max(self.samples[-1][1] - base_finished, 0) / span


@dataclass
class Progress:
    """What the batch object and its event stream told so far, drawn as one line on a terminal (or a line every few
    seconds elsewhere). `clock`: this machine's time in seconds; event times are mapped onto it through the smallest
    delay seen (a live fact's), so replayed facts keep the times they happened at."""

    out: TextIO
    clock: Callable[[], float]
    status: str = "validating"
    reason: str | None = None
    total: int = 0
    validated_lines: int = 0
    counted: tuple[int, int] = (0, 0)
    """(completed, failed) as the batch object last said."""
    by_shard: dict[int, tuple[int, int]] = field(default_factory=dict)
    """(completed, failed) so far per shard, from `progressed` facts (cumulative per shard, never lowered)."""
    window: RateWindow = field(default_factory=RateWindow)
    delay: float | None = None
    """The smallest (local time - event time) seen: the stream's latency plus the clocks' skew."""
    last_drawn: float | None = None

    @property
    def streamed(self) -> int:
        """Lines finished as the `progressed` facts folded so far say: the rate's counts (a resumed wait replays
        them from 0, each at its own time, while the batch object already counts them all)."""
        return sum(completed + failed for completed, failed in self.by_shard.values())

    @property
    def done(self) -> int:
        return max(self.counted[0], sum(completed for completed, _ in self.by_shard.values()))

    @property
    def failed(self) -> int:
        return max(self.counted[1], sum(failed for _, failed in self.by_shard.values()))

    def take_batch(self, batch: Mapping[str, Any], final: bool = False) -> None:
        """The batch object (`GET /v1/batches/{id}`); `final`: its counts replace what the events said."""
        counts = batch.get("request_counts") or {}
        self.status = str(batch.get("status") or self.status)
        self.reason = batch.get("status_reason") or None
        self.total = int(counts.get("total") or 0) or self.total
        self.counted = (int(counts.get("completed") or 0), int(counts.get("failed") or 0))
        if final:
            self.by_shard.clear()

    def take(self, event: Mapping[str, Any]) -> None:
        kind = str(event.get("type", ""))
        at = int(event.get("occurred_at") or 0) / 1000 or self.clock()
        self.delay = min(self.delay, self.clock() - at) if self.delay is not None else self.clock() - at
        self.status = status_after(kind, self.status)
        if kind == "batch.validation_progressed":
            self.validated_lines = int(event.get("lines_read") or 0)
        elif kind == "batch.validated":
            self.total = int(event.get("total_lines") or 0)
        elif kind == "batch.waiting":
            self.reason = str(event.get("reason") or "") or None
        elif kind == "batch.started" and not self.window.samples:
            self.window.add(at, self.streamed)
        elif kind == "batch.progressed":
            shard = int(event.get("shard") or 0)
            old = self.by_shard.get(shard, (0, 0))
            self.by_shard[shard] = (max(old[0], int(event.get("completed") or 0)),
                                    max(old[1], int(event.get("failed") or 0)))
            self.window.add(at, self.streamed)

    def event_now(self) -> float:
        """Now, on the events' clock."""
        return self.clock() - (self.delay or 0.0)

    def line(self) -> str:
        if self.status == "validating":
            return f"validating: {self.validated_lines} lines checked"
        finished = self.done + self.failed
        total = max(self.total, finished)
        filled = BAR_WIDTH * finished // total if total else 0
        bar = "[" + "#" * filled + "." * (BAR_WIDTH - filled) + "]"
        text = f"{bar} {finished}/{total} lines ({self.failed} failed) {self.status}"
        if self.status == "validated" and self.reason:
            return f"{text}: {self.reason}"
        if self.status != "in_progress":
            return text
        now = self.event_now()
        rate = self.window.rate(now)
        if rate is None:
            return text
        text += f", {rate:.1f} lines/s"
        if rate > 0 and self.window.inside(now) >= MIN_SAMPLES_FOR_ETA and total > finished:
            text += f", ETA {clock_text((total - finished) / rate)}"
        return text

    def draw(self, force: bool = False) -> None:
        now = self.clock()
        if self.out.isatty():
            self.out.write("\r\x1b[2K" + self.line())
            self.out.flush()
        elif force or self.last_drawn is None or now - self.last_drawn >= 5:
            self.out.write(self.line() + "\n")
            self.last_drawn = now

    def finish(self) -> None:
        if self.out.isatty():
            self.out.write("\n")
