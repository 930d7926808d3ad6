"""What a batch's own event log says about its attempts: which one is current, whether it must stop and why. A pure
fold over the batch's facts; the running attempt and the finalizer read the same log the same way."""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from contracts.events.batch import (
    AttemptFailed,
    BatchAssigned,
    BatchCancelRequested,
    BatchCreated,
    BatchFinalizing,
    BatchProgressed,
    BatchStarted,
    CancelCode,
    ShardFinished,
    ShardLayout,
)
from contracts.events.registry import AnyEvent
from contracts.lifecycle import ENDING_FACTS, EndReason
from services.executor.domain import REFUSED_ATTEMPT, chunk_position
from services.runtime.nats.foldrules import FoldRules

StopReason = Literal["cancelled", "expired"]
_rules = FoldRules[None]()


@dataclass
class BatchLog:
    expires_at: int | None = None
    """Seconds since the epoch, from the batch's creation."""
    cancel_requested: bool = False
    """A cancel came before the batch's first `finalizing` fact (one after it changes nothing): it ends `cancelled`."""
    finalizing: bool = False
    """A `finalizing` fact is in the log: every line ran, and the batch is past the point of no return."""
    cancel_code: CancelCode = "batch_cancelled"
    """The code never-run lines get: `authorization_revoked` once any cancel came from a key revocation."""
    attempts: set[int] = field(default_factory=set)
    """Attempts assigned or started."""
    started: set[int] = field(default_factory=set)
    """Attempts some delivery started (its `started` fact comes before any chunk it writes)."""
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
    layout_of: dict[int, ShardLayout] = field(default_factory=dict)
    """Attempt → the layout its shard is of (assigned attempts only)."""
    chunks_of: dict[int, set[str]] = field(default_factory=dict)
    """Attempt → the chunk keys its progress facts announced."""
    announced_shard: dict[int, int] = field(default_factory=dict)
    """Attempt → the shard its progress facts name."""
    _latest: dict[int, int] | None = field(default=None, repr=False, compare=False)
    """Shard → its latest attempt; worked out again after an attempt joins."""

    def fold(self, event: AnyEvent, sequence: int = 0) -> None:
        rule = _rules.rule_for(type(event))
        if rule is not None:
            rule(self, event, sequence)

    # The rules: one per fact the attempts care about; every other fact leaves the log as it is.

    @_rules.on(BatchCreated)
    def _created(self, event: BatchCreated, sequence: int) -> None:
        self.expires_at = event.terms.expires_at

    @_rules.on(BatchCancelRequested)
    def _cancel_requested(self, event: BatchCancelRequested, sequence: int) -> None:
        if self.finalizing:
            return
        self.cancel_requested = True
        if event.code != "batch_cancelled":  # a revoked key, or credit run out: its code wins
            self.cancel_code = event.code

    @_rules.on(BatchFinalizing)
    def _finalizing(self, event: BatchFinalizing, sequence: int) -> None:
        self.finalizing = True

    @_rules.on(BatchAssigned)
    def _assigned(self, event: BatchAssigned, sequence: int) -> None:
        self.attempts.add(event.attempt)
        self.shard_of[event.attempt] = event.shard
        self.layout_of[event.attempt] = ShardLayout(shards=event.shards, span=event.shard_span)
        self._latest = None

    @_rules.on(BatchStarted)
    def _started(self, event: BatchStarted, sequence: int) -> None:
        self.started.add(event.attempt)
        if event.attempt not in self.attempts:
            self.attempts.add(event.attempt)
            self._latest = None

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
        self.chunks_of.setdefault(event.attempt, set()).add(event.chunk_key)
        self.announced_shard[event.attempt] = event.shard

    @_rules.on(*ENDING_FACTS)
    def _ended(self, event: AnyEvent, sequence: int) -> None:
        self.ended = event.type

    def is_current(self, attempt: int) -> bool:
        """False once the attempt failed (its lease was lost) or a later attempt of its shard was assigned."""
        if self._latest is None:
            self._latest = {}
            for other in self.attempts:
                shard = self.shard_of.get(other, 0)
                self._latest[shard] = max(other, self._latest.get(shard, 0))
        return attempt not in self.failed and self._latest.get(self.shard_of.get(attempt, 0), 0) <= attempt

    def holds_line(self, chunk_key: str, line: int) -> bool:
        """Whether a line found in this chunk counts: refused by validation, or of the unit its attempt was assigned."""
        attempt = chunk_position(chunk_key)[0]
        if attempt == REFUSED_ATTEMPT:
            return True
        layout = self.layout_of.get(attempt)
        return layout is not None and layout.shard_of(line) == self.shard_of.get(attempt) and line >= 1

    def unit_chunks(self, shard: int, layout: ShardLayout) -> set[str]:
        """Announced chunks that may hold lines of `shard` of `layout`: its own, any of another or unknown layout."""
        keys: set[str] = set()
        for attempt, chunks in self.chunks_of.items():
            if self.layout_of.get(attempt) != layout or self.announced_shard.get(attempt) == shard:
                keys |= chunks
        return keys

    def live_attempt(self) -> int | None:
        """An attempt that may still be running somewhere, if the batch has not ended."""
        if self.ended is not None:
            return None
        live = {attempt for attempt in self.attempts - self.failed - self.finished if self.is_current(attempt)}
        return max(live) if live else None

    def outcome(self, asked: EndReason) -> EndReason:
        """How a batch asked to end `asked` ends, by its log: a cancel (only written before `finalizing`) ends it
        `cancelled`; else `finalizing` means every line ran, so it completes even if asked to expire after."""
        if self.cancel_requested:
            return "cancelled"
        if self.finalizing and asked in ("completed", "cancelled", "expired"):
            return "completed"
        return asked

    def stop_reason(self, now_s: float) -> StopReason | None:
        if self.cancel_requested:
            return "cancelled"
        if self.expires_at is not None and now_s >= self.expires_at:
            return "expired"
        return None


def counts_as_committed(announced: set[str]) -> Callable[[str], bool]:
    """Which result chunks are committed: those a progress fact announced, and the lines validation refused."""
    return lambda key: key in announced or chunk_position(key)[0] == REFUSED_ATTEMPT

