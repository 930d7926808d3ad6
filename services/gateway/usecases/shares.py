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


def recent_lines(batch: Batch, now: float, window_s: float = SHARE_WINDOW_S) -> float:
    """Lines of `batch` committed in the `window_s` before `now`, spread evenly over its run (until now, if running)."""
    done = batch.request_counts.completed + batch.request_counts.failed
    if (start := batch.in_progress_at) is None or done <= 0:
        return 0.0
    ends = [batch.finalizing_at, batch.completed_at, batch.failed_at, batch.expired_at, batch.cancelled_at]
    end = max(float(min((at for at in ends if at is not None), default=now)), start)
    window_start = now - window_s
    if end <= start:  # began and stopped within the same second
        return float(done) if window_start <= end <= now else 0.0
    overlap = min(end, now) - max(start, window_start)
    return done * max(overlap, 0.0) / (end - start)


@dataclass
class _Tally:
    user_id: str | None
    queued: int = 0
    running: int = 0
    left: int = 0
    recent: float = 0.0


def owner_shares(records: Iterable[BatchRecord], organizations: Mapping[str, str | None], now: float,
                 window_s: float = SHARE_WINDOW_S) -> list[OwnerShare]:
    """Every owner with a batch queued, running or that ran in the window, the largest share first; `organizations`
    gives each user's (None, or missing: the default)."""
    tallies: dict[str, _Tally] = {}
    for record in records:
        batch = record.batch
        queued, running = batch.status == "validated", batch.status in IN_FLIGHT
        lines = recent_lines(batch, now, window_s) if running or batch.status in TERMINAL else 0.0
        if not (queued or running or lines > 0):
            continue
        tally = tallies.setdefault(record.owner, _Tally(record.owner_user_id))
        tally.queued += queued
        tally.running += running
        if queued or running:
            counts = batch.request_counts
            tally.left += max(counts.total - counts.completed - counts.failed, 0)
        tally.recent += lines
    total = sum(tally.recent for tally in tallies.values())
    shares = [OwnerShare(owner, tally.user_id,
                         organizations.get(tally.user_id) if tally.user_id is not None else None,
                         tally.queued, tally.running, tally.left, round(tally.recent),
                         round(tally.recent / total, 4) if total > 0 else 0.0)
              for owner, tally in tallies.items()]
    return sorted(shares, key=lambda share: (-share.share, -share.lines_left, share.owner))
