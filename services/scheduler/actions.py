"""What the scheduler decides to do (`Action`s, which the term carries out) and the knobs it follows (`Policy`)."""

from dataclasses import dataclass, field

from contracts.events.batch import ShardLayout
from contracts.lifecycle import EndReason
from services.scheduler.book import BatchPlan
from services.scheduler.fair_share import Weights


@dataclass(frozen=True)
class Policy:
    unit_min_lines: int = 32
    """A batch of at most this many lines is one unit (it finalizes itself); larger ones, units of at least this."""
    unit_max_lines: int = 1024
    """Units are at most this many lines (the grain of sharing and of spreading over executors)."""
    max_queued_lines: int = 1_000_000
    """Lines an owner may have in validated or running batches; a batch past it fails at once."""
    weights: Weights = field(default_factory=Weights)


@dataclass(frozen=True)
class Assign:
    plan: BatchPlan
    executor_id: str
    attempt: int
    shard: int = 0
    layout: ShardLayout = field(default_factory=ShardLayout)


@dataclass(frozen=True)
class Wait:
    plan: BatchPlan
    reason: str


@dataclass(frozen=True)
class FenceAttempt:
    """The attempt's lease is revoked: its executor may no longer commit anything for it."""

    plan: BatchPlan
    attempt: int
    executor_id: str
    code: str
    reason: str


@dataclass(frozen=True)
class DeclareLost:
    executor_id: str
    last_heartbeat_at: int


@dataclass(frozen=True)
class Finalize:
    """The batch's files are assembled and its end stated by `executor_id` alone (None: the control plane)."""

    plan: BatchPlan
    executor_id: str | None
    reason: EndReason
    failure_code: str | None = None
    """For `failed`: the cause, carried into the batch's `batch.failed` once its files are written."""
    failure_message: str | None = None


@dataclass(frozen=True)
class StopRevoked:
    """The batch's key was revoked: it is cancelled with `authorization_revoked` (whatever the revocation's own
    listing of the key's batches saw of a read model lagging behind the log)."""

    plan: BatchPlan


Action = Assign | Wait | FenceAttempt | DeclareLost | Finalize | StopRevoked
QUEUED = "Queued:"
"""How every reason of a batch waiting only for a free place begins (the standings refine it)."""
