"""A batch's plan as the scheduler keeps it: its terms, its units (shards) and their attempts, and where it stands."""

from dataclasses import dataclass, field
from typing import Literal

from contracts.api.batch import Placement
from contracts.events.batch import BatchProgressed, CancelCode, ShardLayout
from contracts.ids import owner_id
from contracts.terms import BatchTerms

Phase = Literal["validating", "validated", "ended"]
ProgressStatement = tuple[int, int, int, int, int, str | None]
"""What a progress fact states of its chunk: attempt, chunk, shard, completed, failed and usage."""


def progress_statement(event: BatchProgressed) -> ProgressStatement:
    return (event.attempt, event.chunk, event.shard, event.completed, event.failed,
            event.usage.model_dump_json() if event.usage is not None else None)
UNSTARTED_LOSSES_FORGIVEN = 6
"""Attempts of a shard lost with their executor before they started that do not count against the limit."""


@dataclass
class ShardRun:
    """One shard's attempts: the live one (if any), the failed ones, and whether the shard is done."""

    attempt: int = 0
    """The shard's latest attempt."""
    executor_id: str | None = None
    """Who runs the latest attempt, while it runs."""
    running_since_ms: int = 0
    failed_attempts: set[int] = field(default_factory=set)
    progressed_attempts: set[int] = field(default_factory=set)
    """Attempts that committed at least one chunk."""
    started_at: dict[int, int] = field(default_factory=dict)
    """Attempt → when it started (ms, the executor's clock, as its registrations)."""
    unstarted_losses: set[int] = field(default_factory=set)
    """Attempts fenced with their executor before they started there: they say nothing about this shard."""
    tried_executors: set[str] = field(default_factory=set)
    finished: bool = False
    """Every line of the shard is committed."""

    @property
    def running(self) -> bool:
        return self.executor_id is not None

    @property
    def strikes(self) -> int:
        """Failed attempts that count against the limit: those that committed nothing, and never-started ones past a
        few (a shard that never even gets to start must still fail some day)."""
        fruitless = self.failed_attempts - self.progressed_attempts
        unstarted = fruitless & self.unstarted_losses
        return len(fruitless - unstarted) + max(0, len(unstarted) - UNSTARTED_LOSSES_FORGIVEN)


@dataclass
class BatchPlan:
    batch_id: str
    terms: BatchTerms
    phase: Phase = "validating"
    model: str | None = None
    total_lines: int = 0
    rejections_object_key: str | None = None
    validated_order: int = 0
    """Position among the batches validated so far (1 = first): FIFO within an owner."""
    validated_at_ms: int = 0
    """When it was first validated (its first standing comes a moment after)."""
    queued_before: int = 0
    """Lines of the owner's open validated batches when this one was validated (for the queued-lines limit)."""
    layout: ShardLayout | None = None
    """Fixed by the first assignment; None before."""
    shards: dict[int, ShardRun] = field(default_factory=dict)
    attempt: int = 0
    """The highest attempt number assigned so far, over all shards."""
    attempt_shard: dict[int, int] = field(default_factory=dict)
    assignees: dict[int, str] = field(default_factory=dict)
    """Attempt → the executor it was assigned to (for good: who may state that attempt's facts)."""
    waiting_reason: str | None = None
    """The batch's standing or why it waits, as last stated (`batch.waiting`)."""
    waiting_at_ms: int | None = None
    unit_done: dict[int, int] = field(default_factory=dict)
    """Unit → its lines committed so far (progress counts are cumulative per unit)."""
    announced: dict[str, ProgressStatement] = field(default_factory=dict)
    """Result chunk key → what the first stored progress fact announcing it stated: a fact stating it again is a
    repeat only if it states the same (never new lines), and refused otherwise."""
    done_lines: int = 0
    cancel_requested_at_ms: int | None = None
    cancel_code: CancelCode = "batch_cancelled"
    finalizing: bool = False
    """A `finalizing` fact is in the log: its files are being written, and a cancel can no longer be asked."""
    finalizer: str | None = None
    """Who this scheduler sent the finalize command to (not in the log: a new leader sends it again); only it may
    read the batch's objects and state its end."""
    held: bool = False
    """Created with `hold`: never assigned until released."""
    owner_user_id: str | None = None
    organization_id: str | None = None
    placement: Placement = "approved_providers"
    """Which executors may run it (`services.scheduler.placement`)."""

    @property
    def owner(self) -> str:
        """Whose share of the fleet the batch uses: its user, or its key alone."""
        return owner_id(self.owner_user_id, self.terms.owner_key_id)

    @property
    def expires_at_ms(self) -> int:
        return (self.terms.expires_at or 0) * 1000  # `batch.created` always says it

    running_units: set[int] = field(default_factory=set)
    """Units with an attempt running now (an index of `shards`, kept by `reindex`)."""
    retry_units: set[int] = field(default_factory=set)
    """Units tried whose last attempt failed or stopped without finishing."""
    finished_units: set[int] = field(default_factory=set)
    touched: int = -1
    """The highest unit index assigned so far: units are handed out in order, so every later one is fresh."""

    def shard(self, index: int) -> ShardRun:
        return self.shards.setdefault(index, ShardRun())

    def reindex(self, index: int) -> None:
        """Keep the unit sets in step with the unit's run after a fact changed it."""
        run = self.shard(index)
        self.touched = max(self.touched, index)
        for units, member in ((self.running_units, run.running), (self.finished_units, run.finished),
                              (self.retry_units, not run.running and not run.finished)):
            if member:
                units.add(index)
            else:
                units.discard(index)

    @property
    def unit_count(self) -> int:
        return self.layout.shards if self.layout is not None else 1

    def running_shards(self) -> list[tuple[int, ShardRun]]:
        return [(index, self.shards[index]) for index in sorted(self.running_units)]

    def pending_count(self) -> int:
        """Units that need an attempt: never assigned, or to retry."""
        return len(self.retry_units) + max(self.unit_count - 1 - self.touched, 0)

    def unit_lines(self, index: int) -> int:
        layout = self.layout or ShardLayout()
        last = layout.last_line(index)
        return (self.total_lines if last is None else last) - layout.first_line(index) + 1

    def pending_lines(self) -> int:
        """Input lines in the units that need an attempt (about: a retried unit may have committed some)."""
        if self.layout is None:
            return self.total_lines
        fresh = range(self.touched + 1, self.unit_count)
        lines = (self.total_lines - fresh[0] * self.layout.span) if fresh else 0
        return lines + sum(self.unit_lines(index) for index in self.retry_units)

    def in_flight_lines(self) -> int:
        return sum(self.unit_lines(index) for index in self.running_units)

    @property
    def all_finished(self) -> bool:
        return self.layout is not None and len(self.finished_units) >= self.layout.shards

    @property
    def running(self) -> bool:
        return bool(self.running_units)
