"""The batch census behind the fleet-wide gauges and the quotes' queue estimate: batches per status, the lines still
to run per model and the lines each model ran in the last hour, kept by one watch on the read model's batch records,
so neither a refresh nor a quote reads any record. Ended batches are counts (plus a bounded memory of ended ids, so a
rewrite is not counted twice); each (re)count, at start, after a broken watch and hourly, replaces the last once
complete."""

import asyncio
import time
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field, fields

from nats.js.kv import KeyValue

from contracts.lifecycle import TERMINAL
from contracts.readmodel import BatchRecord
from contracts.subjects import read_model_key
from services.gateway.usecases.shares import SHARE_WINDOW_S, RunSpan
from services.runtime.nats.kv_watch import decoded, keep

RECENTLY_ENDED = 100_000
"""Ended batch ids remembered, so a record written again after its batch ended is not counted twice."""
RECOUNT_S = 3600.0
"""How often the census counts every batch again from the read model (bounding what a late rewrite miscounts)."""
RATE_WINDOW_S = 3600.0
"""The window of ended batches a model's rate is measured over."""


@dataclass
class RateWindow:
    """One model's batches that ended within `RATE_WINDOW_S`, in the order they were seen ending, with the lines they
    ran summed and their earliest start kept as they come and go: a quote costs the same whatever the fleet ran."""

    ran: deque[tuple[int, float, float, int]] = field(default_factory=deque)
    """(arrival, ended, started, lines) of each batch."""
    earliest: deque[tuple[int, float]] = field(default_factory=deque)
    """(arrival, started) with starts increasing: the first is the window's earliest start."""
    done: int = 0
    arrivals: int = 0

    def add(self, ended: float, started: float, lines: int) -> None:
        self.arrivals += 1
        self.ran.append((self.arrivals, ended, started, lines))
        self.done += lines
        while self.earliest and self.earliest[-1][1] >= started:
            self.earliest.pop()
        self.earliest.append((self.arrivals, started))

    def rate(self, now: float) -> float | None:
        """Lines per second over the window (None: nothing ran in it)."""
        while self.ran and now - self.ran[0][1] > RATE_WINDOW_S:
            arrival, _, _, lines = self.ran.popleft()
            self.done -= lines
            if self.earliest and self.earliest[0][0] == arrival:
                self.earliest.popleft()
        if not self.ran or not self.done:
            return None
        return self.done / max(now - max(self.earliest[0][1], now - RATE_WINDOW_S), 1.0)


def remaining_lines(record: BatchRecord) -> int:
    counts = record.batch.request_counts
    return max(counts.total - counts.completed - counts.failed, 0)


def ended_at(record: BatchRecord) -> int | None:
    batch = record.batch
    return batch.completed_at or batch.cancelled_at or batch.expired_at or batch.failed_at


@dataclass
class Counts:
    open: dict[str, BatchRecord] = field(default_factory=dict)
    """Every unfinished batch's latest record."""
    ended: Counter[str] = field(default_factory=Counter)
    """Ended batches, by status."""
    recently_ended: OrderedDict[str, str] = field(default_factory=OrderedDict)
    ahead: Counter[str] = field(default_factory=Counter)
    """Lines still to run of the unfinished batches, per model."""
    ran: dict[str, RateWindow] = field(default_factory=dict)
    """Per model, the batches that ended within `RATE_WINDOW_S`."""
    ended_runs: deque[RunSpan] = field(default_factory=deque)
    """The runs of the batches that ended within `SHARE_WINDOW_S`, in the order seen ending (the owners' shares)."""

    def record(self, batch_id: str, record: BatchRecord | None, now: float | None = None) -> None:
        """Count the latest record of a batch (None: its record was deleted)."""
        was_ended = batch_id in self.recently_ended
        if was_ended:
            self.ended[self.recently_ended.pop(batch_id)] -= 1
        left = self.open.pop(batch_id, None)
        if left is not None:
            self.ahead[left.batch.model or ""] -= remaining_lines(left)
        if record is None:
            return
        status = record.batch.status
        if status in TERMINAL:
            self.ended[status] += 1
            self.recently_ended[batch_id] = status
            if len(self.recently_ended) > RECENTLY_ENDED:
                self.recently_ended.popitem(last=False)  # rewritten much later: counted once more, until a recount
            if not was_ended:
                self._ran(record, time.time() if now is None else now)
                self._ended_run(RunSpan.of(record), time.time() if now is None else now)
        else:
            self.open[batch_id] = record
            self.ahead[record.batch.model or ""] += remaining_lines(record)

    def _ran(self, record: BatchRecord, now: float) -> None:
        batch, end = record.batch, ended_at(record)
        if batch.in_progress_at is None or end is None or now - end > RATE_WINDOW_S:
            return
        counts = batch.request_counts
        self.ran.setdefault(batch.model or "", RateWindow()).add(
            float(end), float(batch.in_progress_at), counts.completed + counts.failed)

    def _ended_run(self, span: RunSpan, now: float) -> None:
        if span.start is not None and span.done > 0 and (span.end or 0) >= now - SHARE_WINDOW_S:
            self.ended_runs.append(span)
        self._drop_ended_runs(now)  # never a copy of the window per batch: that was quadratic in the ends per window

    def _drop_ended_runs(self, now: float) -> None:
        """Forget the runs at the front that ended before the share window."""
        while self.ended_runs and (self.ended_runs[0].end or 0) < now - SHARE_WINDOW_S:
            self.ended_runs.popleft()

    def runs_ended_within(self, now: float, window_s: float = SHARE_WINDOW_S) -> list[RunSpan]:
        """The runs of batches that ended in the `window_s` before `now` (those seen ending earlier are dropped)."""
        self._drop_ended_runs(now)
        return [span for span in self.ended_runs if (span.end or 0) >= now - window_s]

    def queue(self, model: str, now: float) -> tuple[int, float | None]:
        """The model's lines still to run, and its rate (lines per second) over the last `RATE_WINDOW_S` (None: it
        ran nothing in it)."""
        window = self.ran.get(model)
        rate = window.rate(now) if window is not None else None
        return max(self.ahead.get(model, 0), 0), rate

    def by_status(self) -> dict[str, int]:
        counts: Counter[str] = Counter(record.batch.status for record in self.open.values())
        counts.update(self.ended)
        return {status: count for status, count in counts.items() if count > 0}


@dataclass
class BatchCensus(Counts):
    """The counts the gauges and quotes read: replaced whole once a (re)count has read every batch's current record
    (a `Keeper` of the read model's batch records)."""

    ready: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the watch has delivered every batch's current record."""
    counting: Counts | None = None
    """A (re)count under way, until it has read every current record."""
    counted_at: float = 0.0
    """When (monotonic) the last (re)count began."""

    def reset(self, counts: Counts | None = None) -> None:
        """Take `counts` (none: empty ones) in place of the current, all at once: never half a count."""
        counts = counts or Counts()
        for each in fields(Counts):
            setattr(self, each.name, getattr(counts, each.name))

    def restart(self) -> None:
        self.counting, self.counted_at = Counts(), time.monotonic()

    def put(self, key: str, value: bytes | None, revision: int) -> None:
        """A record counts in the count under way and in the current one (which a recount would otherwise leave as it
        was until it completes: the overview's queue and progress would stand still for its length)."""
        batch_id, record = key.removeprefix(read_model_key("batch", "")), decoded(BatchRecord, key, value,
                                                                                   "a batch record")
        if self.counting is not None:
            self.counting.record(batch_id, record)
            if not self.ready.is_set():
                return  # the first count: nothing current yet
        self.record(batch_id, record)

    def current(self) -> None:
        self.reset(self.counting)
        self.counting = None
        self.ready.set()

    def lost(self) -> None:
        self.counting = None  # the counts stay as they were until a watch has counted again

    def recount_due(self) -> bool:
        """Counting again on the side every `RECOUNT_S`: a record rewritten long after its batch ended then counts
        once, not twice."""
        return self.counting is None and self.ready.is_set() and time.monotonic() - self.counted_at > RECOUNT_S

    async def follow(self, kv: KeyValue) -> None:
        """Keep the census as the read model changes, counting again after a broken watch and every `RECOUNT_S`."""
        await keep(kv, read_model_key("batch", "*"), self, "the batch census", ended=self.recount_due)
