"""What a batch's own event log says about its attempts: which one is current, whether it must stop and why.

A pure fold over the batch's facts; the running attempt and the finalizer read the same log the same way.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from contracts.events.batch import (
    AttemptFailed,
    BatchAssigned,
    BatchCancelRequested,
    BatchCreated,
    BatchProgressed,
    BatchStarted,
    CancelCode,
    ShardFinished,
)
from contracts.events.registry import AnyEvent
from contracts.lifecycle import ENDING_FACTS
from services.executor.domain import REFUSED_ATTEMPT, chunk_position
from services.runtime.foldrules import FoldRules

StopReason = Literal["cancelled", "expired"]
Outcome = Literal["completed", "cancelled", "expired", "failed"]
_rules = FoldRules[None]()


@dataclass
class BatchLog:
    expires_at: int | None = None
    """Seconds since the epoch, from the batch's creation."""
    cancel_requested: bool = False
    cancel_code: CancelCode = "batch_cancelled"
    """The code never-run lines get: `authorization_revoked` once any cancel came from a key revocation."""
    attempts: set[int] = field(default_factory=set)
    """Attempts assigned or started."""
    shard_of: dict[int, int] = field(default_factory=dict)
    """Attempt → the shard it runs (assigned attempts only)."""
    failed: set[int] = field(default_factory=set)
    finished: set[int] = field(default_factory=set)
    """Attempts whose shard finished (`shard_finished`): they run no more."""
    fence_sequence: int = 0
    """Stream sequence of the batch's latest `attempt_failed`: commits are conditional on it (a hard fence)."""
    announced: set[str] = field(default_factory=set)
    """Result chunk keys a progress fact announced: only these are committed."""
    ended: str | None = None
    """The type of the terminal fact, once there is one."""

    def fold(self, event: AnyEvent, sequence: int = 0) -> None:
        rule = _rules.rule_for(type(event))
        if rule is not None:
            rule(self, event, sequence)

    # The rules: one per fact the attempts care about; every other fact leaves the log as it is.

    @_rules.on(BatchCreated)
    def _created(self, event: BatchCreated, sequence: int) -> None:
        self.expires_at = event.expires_at

    @_rules.on(BatchCancelRequested)
    def _cancel_requested(self, event: BatchCancelRequested, sequence: int) -> None:
        self.cancel_requested = True
        if event.code == "authorization_revoked":
            self.cancel_code = event.code

    @_rules.on(BatchAssigned)
    def _assigned(self, event: BatchAssigned, sequence: int) -> None:
        self.attempts.add(event.attempt)
        self.shard_of[event.attempt] = event.shard

    @_rules.on(BatchStarted)
    def _started(self, event: BatchStarted, sequence: int) -> None:
        self.attempts.add(event.attempt)

    @_rules.on(AttemptFailed)
    def _attempt_failed(self, event: AttemptFailed, sequence: int) -> None:
        self.failed.add(event.attempt)
        self.fence_sequence = max(self.fence_sequence, sequence)

    @_rules.on(ShardFinished)
    def _shard_finished(self, event: ShardFinished, sequence: int) -> None:
        self.finished.add(event.attempt)

    @_rules.on(BatchProgressed)
    def _progressed(self, event: BatchProgressed, sequence: int) -> None:
        self.announced.add(event.chunk_key)

    @_rules.on(*ENDING_FACTS)
    def _ended(self, event: AnyEvent, sequence: int) -> None:
        self.ended = event.type

    def is_current(self, attempt: int) -> bool:
        """False once the attempt failed (its lease was lost) or a later attempt of its shard was assigned."""
        shard = self.shard_of.get(attempt, 0)
        return attempt not in self.failed and not any(
            other > attempt and self.shard_of.get(other, 0) == shard for other in self.attempts)

    def live_attempt(self) -> int | None:
        """An attempt that may still be running somewhere, if the batch has not ended."""
        if self.ended is not None:
            return None
        live = {attempt for attempt in self.attempts - self.failed - self.finished if self.is_current(attempt)}
        return max(live) if live else None

    def stop_reason(self, now_s: float) -> StopReason | None:
        if self.cancel_requested:
            return "cancelled"
        if self.expires_at is not None and now_s >= self.expires_at:
            return "expired"
        return None


def counts_as_committed(announced: set[str]) -> Callable[[str], bool]:
    """Which result chunks are committed: those a progress fact announced, and the lines validation refused."""
    return lambda key: key in announced or chunk_position(key)[0] == REFUSED_ATTEMPT


def attempt_chunks(attempt: int) -> Callable[[str], bool]:
    """The chunks `attempt` itself wrote (the latest may be unannounced: a delivery died before announcing it)."""
    return lambda key: chunk_position(key)[0] == attempt
