"""What a batch's own event log says about its attempts: which one is current, whether it must stop and why.

A pure fold over the batch's facts; the running attempt and the finalizer read the same log the same way.
"""

from dataclasses import dataclass, field
from typing import Literal

from contracts.events.batch import (
    AttemptFailed,
    BatchAssigned,
    BatchCancelled,
    BatchCancelRequested,
    BatchCompleted,
    BatchCreated,
    BatchExpired,
    BatchFailed,
    BatchStarted,
    CancelCode,
)
from contracts.events.registry import AnyEvent

StopReason = Literal["cancelled", "expired"]
Outcome = Literal["completed", "cancelled", "expired"]

TERMINAL = (BatchCompleted, BatchCancelled, BatchExpired, BatchFailed)


@dataclass
class BatchLog:
    expires_at: int | None = None
    """Seconds since the epoch, from the batch's creation."""
    cancel_requested: bool = False
    cancel_code: CancelCode = "batch_cancelled"
    """The code never-run lines get: `authorization_revoked` once any cancel came from a key revocation."""
    attempts: set[int] = field(default_factory=set)
    """Attempts assigned or started."""
    failed: set[int] = field(default_factory=set)
    ended: str | None = None
    """The type of the terminal fact, once there is one."""

    def fold(self, event: AnyEvent) -> None:
        if isinstance(event, BatchCreated):
            self.expires_at = event.expires_at
        elif isinstance(event, BatchCancelRequested):
            self.cancel_requested = True
            if event.code == "authorization_revoked":
                self.cancel_code = event.code
        elif isinstance(event, BatchAssigned | BatchStarted):
            self.attempts.add(event.attempt)
        elif isinstance(event, AttemptFailed):
            self.failed.add(event.attempt)
        elif isinstance(event, TERMINAL):
            self.ended = event.type

    def is_current(self, attempt: int) -> bool:
        """False once the attempt failed (its lease was lost) or a later attempt was assigned: fenced off."""
        return attempt not in self.failed and not any(other > attempt for other in self.attempts)

    def live_attempt(self) -> int | None:
        """The attempt that may still be running somewhere, if the batch has not ended."""
        if self.ended is not None:
            return None
        live = self.attempts - self.failed
        return max(live) if live else None

    def stop_reason(self, now_s: float) -> StopReason | None:
        if self.cancel_requested:
            return "cancelled"
        if self.expires_at is not None and now_s >= self.expires_at:
            return "expired"
        return None
