"""Each owner's share of the fleet for the operator: lines committed in the last minutes, per user. A record holds a
batch's counts and run span, not when each line committed, so its lines are spread evenly over its run and a share
counts the part of that run inside the window."""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from contracts.api.batch import Batch
from contracts.lifecycle import IN_FLIGHT, TERMINAL
from contracts.readmodel import BatchRecord

SHARE_WINDOW_S = 300.0
"""The last five minutes."""


@dataclass(frozen=True)
class OwnerShare:
    owner: str
    """Who owns the batches: `user-<id>`, or `key-<id>` for a key without a user."""
    user_id: str | None
    organization_id: str | None
    """The user's organisation; None: the default one (or a key without a user)."""
    queued_batches: int
    """Validated batches waiting to run."""
    running_batches: int
    """Batches running (or winding down for a cancel)."""
    lines_left: int
    """Lines of its queued and running batches not committed yet."""
    recent_lines: int
    """Lines committed in the window."""
    share: float
    """`recent_lines` over every owner's: its share of what the fleet did in the window (0 to 1)."""


@dataclass(frozen=True)
class RunSpan:
    """What a share needs of a batch's run: whose it is, when it ran and how many lines it committed."""

    owner: str
    user_id: str | None
    start: float | None
    """When its first line ran (None: none did)."""
    end: float | None
    """When it stopped running (None: it still runs)."""
    done: int

    @classmethod
    def of(cls, record: BatchRecord) -> "RunSpan":
        batch = record.batch
        ends = [batch.finalizing_at, batch.completed_at, batch.failed_at, batch.expired_at, batch.cancelled_at]
        return cls(record.owner, record.owner_user_id, batch.in_progress_at,
                   min((at for at in ends if at is not None), default=None),
                   batch.request_counts.completed + batch.request_counts.failed)

    def lines_within(self, now: float, window_s: float = SHARE_WINDOW_S) -> float:
        """Lines committed in the `window_s` before `now`, spread evenly over the run (until now, if running)."""
        if self.start is None or self.done <= 0:
            return 0.0
        end = max(float(self.end if self.end is not None else now), self.start)
        window_start = now - window_s
        if end <= self.start:  # began and stopped within the same second
            return float(self.done) if window_start <= end <= now else 0.0
        overlap = min(end, now) - max(self.start, window_start)
        return self.done * max(overlap, 0.0) / (end - self.start)


def recent_lines(batch: Batch, now: float, window_s: float = SHARE_WINDOW_S) -> float:
    """Lines of `batch` committed in the `window_s` before `now`, spread evenly over its run (until now, if running)."""
    return RunSpan.of(BatchRecord(owner_key_id="", batch=batch, last_sequence=0)).lines_within(now, window_s)


@dataclass
class _Tally:
    user_id: str | None
    queued: int = 0
    running: int = 0
    left: int = 0
    recent: float = 0.0


def owner_shares(records: Iterable[BatchRecord], organizations: Mapping[str, str | None], now: float,
                 window_s: float = SHARE_WINDOW_S, ended: Iterable[RunSpan] = ()) -> list[OwnerShare]:
    """Every owner with a batch queued, running or that ran in the window, the largest share first, from `records`
    and the runs of batches that `ended` (besides any in `records`); `organizations` gives each user's (None, or
    missing: the default)."""
    tallies: dict[str, _Tally] = {}
    for record in records:
        batch = record.batch
        queued, running = batch.status == "validated", batch.status in IN_FLIGHT
        lines = RunSpan.of(record).lines_within(now, window_s) if running or batch.status in TERMINAL else 0.0
        if not (queued or running or lines > 0):
            continue
        tally = tallies.setdefault(record.owner, _Tally(record.owner_user_id))
        tally.queued += queued
        tally.running += running
        if queued or running:
            counts = batch.request_counts
            tally.left += max(counts.total - counts.completed - counts.failed, 0)
        tally.recent += lines
    for span in ended:
        if (lines := span.lines_within(now, window_s)) > 0:
            tallies.setdefault(span.owner, _Tally(span.user_id)).recent += lines
    total = sum(tally.recent for tally in tallies.values())
    shares = [OwnerShare(owner, tally.user_id,
                         organizations.get(tally.user_id) if tally.user_id is not None else None,
                         tally.queued, tally.running, tally.left, round(tally.recent),
                         round(tally.recent / total, 4) if total > 0 else 0.0)
              for owner, tally in tallies.items()]
    return sorted(shares, key=lambda share: (-share.share, -share.lines_left, share.owner))
