"""The scheduler's view of every unfinished batch, its shards and the known fleet, folded from the event log."""

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import NamedTuple

from contracts.events.batch import (
    AttemptFailed,
    BatchAssigned,
    BatchCancelRequested,
    BatchCreated,
    BatchFinalizing,
    BatchProgressed,
    BatchReleased,
    BatchStarted,
    BatchValidated,
    BatchWaiting,
    ShardFinished,
)
from contracts.events.envelope import Event
from contracts.events.executor import ExecutorAdvert, ExecutorLost, ExecutorRegistered
from contracts.events.key import KeyRevoked
from contracts.events.registry import AnyEvent
from contracts.lifecycle import ENDING_FACTS
from services.runtime.nats.foldrules import FoldRules
from services.scheduler.domain import HEARTBEAT_FRESH_MS
from services.scheduler.placement import PLACEMENT_FACTS, PLACEMENT_WITHDRAWN, Placements
from services.scheduler.plans import BatchPlan, ShardRun, progress_statement
from services.scheduler.standing import RateMeter

CONTROL_PLANE = "(control plane)"
"""`BatchPlan.finalizer` when the leading scheduler finalizes itself (no executor id holds a space or parenthesis)."""
STORAGE_UNAVAILABLE = "storage_unavailable"
"""An attempt given up on a write fault (full disk, restarting broker): it says nothing of the unit, so is forgiven."""
ENDED_PLANS_KEPT_MS = 3_600_000
"""An ended batch's plan is kept this long after its end, in the log's time: its executors' late facts and reads are
judged by it; then it is forgotten, so a leader's book holds its open batches and the last hour's ends, not every
batch the log ever had."""
FORGOTTEN_IDS_KEPT_MS = 7 * 24 * 3_600_000
"""A forgotten batch's id is kept this long past its expiry (the log's time, which may run ahead of a gateway's
clock): a create of it stated again then would expire at once anyway."""
NEW_EXECUTOR_IDS_WINDOW_MS = 24 * 3_600_000
NEW_EXECUTOR_IDS_PER_WINDOW = 100
"""New executor ids one provider (or one worker key of no provider) may bring in any 24 h of log time: an id is kept
for good (in the book, the read model and the log), so one that comes with a new id on every start (or a key used
to mint ids) is told to reuse one; an executor keeps its id across restarts (`SHESHNAG_EXECUTOR_EXECUTOR_ID`)."""
__all__ = ["CONTROL_PLANE", "STORAGE_UNAVAILABLE", "BatchPlan", "Book", "ExecutorOwner", "ShardRun", "book_facts"]
_fleet_rules = FoldRules[None]()
_plan_rules = FoldRules[None]()


@dataclass(frozen=True)
class ExecutorOwner:
    """Whose an executor id is: its first worker key's provider, or that key alone (an operator's, no provider)."""

    provider_id: str | None
    worker_key_id: str

    @property
    def label(self) -> str:
        """Whom its new ids count against: its provider, else its key."""
        return self.provider_id if self.provider_id is not None else f"key {self.worker_key_id}"

    def admits(self, provider_id: str | None, worker_key_id: str) -> bool:
        """Whether a worker key of `provider_id` may act as this executor: the same provider's, or the same key."""
        return worker_key_id == self.worker_key_id or (self.provider_id is not None
                                                        and provider_id == self.provider_id)


class Forgotten(NamedTuple):
    """What is kept of a forgotten plan: when its batch expires, and the executors it had (they may read its end)."""

    expires_at_ms: int
    executors: frozenset[str]


@dataclass
class Book:
    plans: dict[str, BatchPlan] = field(default_factory=dict)
    known_executors: dict[str, int] = field(default_factory=dict)
    """Executor id → last heartbeat seen (ms), for every executor not declared lost since."""
    admitted: set[str] = field(default_factory=set)
    """Executors that registered with a worker key: the only ones given work."""
    incarnations: dict[str, int] = field(default_factory=dict)
    """Executor id → when its current process registered (ms); work assigned before that died with the old one."""
    protocols: dict[str, int] = field(default_factory=dict)
    """Executor id → the command protocol its current process advertised when it registered."""
    lost: dict[str, int] = field(default_factory=dict)
    """Executor id → its last heartbeat (ms) when it was declared lost; a later one means it is back."""
    owners: dict[str, "ExecutorOwner"] = field(default_factory=dict)
    """Executor id → who registered it first: the only provider (or operator key) it is ever admitted for."""
    key_holders: dict[str, str] = field(default_factory=dict)
    """Worker key id → the executor it last registered (one key serves one live executor at a time)."""
    new_ids: dict[str, deque[int]] = field(default_factory=dict)
    """Owner label → when (log time) each of its executor ids first registered, over the last
    `NEW_EXECUTOR_IDS_WINDOW_MS` (older ones are dropped as new ones come)."""
    revoked_keys: set[str] = field(default_factory=set)
    """Ids of revoked keys: a batch of one is stopped and given no more work."""
    validated_count: int = 0
    open: dict[str, BatchPlan] = field(default_factory=dict)
    """The batches that have not ended (an ended one's last attempt may still read as running: a batch that
    finalized itself states no unit finished)."""
    queued_lines: dict[str, int] = field(default_factory=dict)
    """Owner → lines of their open validated batches."""
    rates: RateMeter = field(default_factory=RateMeter)
    """Lines per second the fleet ran each model at lately, from progress facts."""
    placements: Placements = field(default_factory=Placements)
    """Each executor's provider, and each provider's organisation and approvals: who may run whose batch."""
    ended: deque[tuple[int, str]] = field(default_factory=deque)
    """(when, batch id) of the ended plans still kept, in the order they ended."""
    log_time_ms: int = 0
    """The latest `occurred_at` folded: the log's own clock, the same on every replay."""
    forgotten: OrderedDict[str, Forgotten] = field(default_factory=OrderedDict)
    """The forgotten plans, by batch id: a create of one again is a repeat, never a new batch, and the executors it
    had may still read how it ended. Kept until well past its expiry (no create of it could run any more), whatever
    the clocks of its producers."""

    def note_heartbeats(self, adverts: list[ExecutorAdvert]) -> None:
        """Remember each known executor's latest heartbeat (a scan that misses an advert must not make it look lost).
        One declared lost is live again on a beat from after it could be declared lost (what it ran was fenced)."""
        for advert in adverts:
            lost_at = self.lost.get(advert.executor_id)
            if lost_at is not None and advert.heartbeat_at > lost_at + HEARTBEAT_FRESH_MS:
                del self.lost[advert.executor_id]
                self.known_executors[advert.executor_id] = advert.heartbeat_at
        self.known_executors = self.last_heard(adverts)

    def last_heard(self, adverts: list[ExecutorAdvert]) -> dict[str, int]:
        """Each executor in the fleet (registered, not lost) → its latest heartbeat: the one measure of liveness."""
        heard = dict(self.known_executors)
        for advert in adverts:
            if advert.executor_id in heard:
                heard[advert.executor_id] = max(heard[advert.executor_id], advert.heartbeat_at)
        return heard

    def apply(self, event: AnyEvent) -> None:
        if event.occurred_at > self.log_time_ms:
            self.log_time_ms = event.occurred_at
        if isinstance(event, PLACEMENT_FACTS):
            self.placements.apply(event)
        rule = _fleet_rules.rule_for(type(event))
        if rule is not None:
            rule(self, event)
            return
        plan = self.plans.get(event.aggregate_id)
        if plan is None or plan.phase == "ended":
            return
        rule = _plan_rules.rule_for(type(event))
        if rule is not None:
            rule(self, plan, event)

    # Rules for the fleet and for new batches: they need no plan.

    @_fleet_rules.on(ExecutorRegistered)
    def _registered(self, event: ExecutorRegistered) -> None:
        if event.worker_key_id is not None:
            executor_id = event.aggregate_id
            # Stated times never pass the scheduler's clock at registration (older facts are clamped as read).
            heard = min(event.advert.heartbeat_at, event.occurred_at)
            self.known_executors[executor_id] = max(heard, self.known_executors.get(executor_id, 0))
            self.lost.pop(executor_id, None)
            self.admitted.add(executor_id)
            started = min(event.started_at, event.occurred_at)
            if started >= self.incarnations.get(executor_id, 0):
                if event.advert.protocol < self.protocols.get(executor_id, event.advert.protocol):
                    # Back on an older command protocol, it drops a finalize sent in the newer: choose again.
                    for plan in self.open.values():
                        if plan.finalizer == executor_id:
                            plan.finalizer = None
                self.protocols[executor_id] = event.advert.protocol
            self.incarnations[executor_id] = max(started, self.incarnations.get(executor_id, 0))
            provider_id = self.placements.provider_of(event)  # also for a fact from before it named one
            if executor_id not in self.owners:
                owner = self.owners[executor_id] = ExecutorOwner(provider_id, event.worker_key_id)
                times = self.new_ids.setdefault(owner.label, deque())
                times.append(event.occurred_at)
                self.new_ids_of(owner.label, event.occurred_at)  # the older ones go
            self.key_holders[event.worker_key_id] = executor_id

    def new_ids_of(self, label: str, now_ms: int) -> int:
        """How many of the owner's executor ids first registered within the window (as of `now_ms`); asking keeps
        nothing for an owner that brought none."""
        times = self.new_ids.get(label)
        while times and times[0] <= now_ms - NEW_EXECUTOR_IDS_WINDOW_MS:
            times.popleft()
        return len(times) if times else 0

    @_fleet_rules.on(ExecutorLost)
    def _lost(self, event: ExecutorLost) -> None:
        # Not if heard from since (it came back before this fact was read again).
        if self.known_executors.get(event.aggregate_id, 0) <= event.last_heartbeat_at:
            self.known_executors.pop(event.aggregate_id, None)
            self.lost[event.aggregate_id] = max(event.last_heartbeat_at, self.lost.get(event.aggregate_id, 0))

    @_fleet_rules.on(BatchCreated)
    def _created(self, event: BatchCreated) -> None:
        if event.aggregate_id in self.plans or event.aggregate_id in self.forgotten:
            return  # a repeat: of a batch known, or of one that ended long enough ago to be forgotten
        self.plans[event.aggregate_id] = self.open[event.aggregate_id] = BatchPlan(
            event.aggregate_id, event.terms, held=event.hold, owner_user_id=event.owner_user_id,
            organization_id=event.organization_id, placement=event.placement)

    @_fleet_rules.on(KeyRevoked)
    def _key_revoked(self, event: KeyRevoked) -> None:
        self.revoked_keys.add(event.key_id)

    # Rules for a batch's plan, while it has not ended; every other fact leaves the plan as it is.

    @_plan_rules.on(*ENDING_FACTS)
    def _ended(self, plan: BatchPlan, event: AnyEvent) -> None:
        if plan.phase == "validated":
            left = self.queued_lines.get(plan.owner, 0) - plan.total_lines
            if left:
                self.queued_lines[plan.owner] = left
            else:  # an owner with nothing queued is not kept
                self.queued_lines.pop(plan.owner, None)
        plan.phase = "ended"
        self.open.pop(plan.batch_id, None)
        plan.announced.clear()  # read only while it runs
        self.ended.append((self.log_time_ms, plan.batch_id))  # (`apply` took this fact's time in already)
        self._forget_ended(self.log_time_ms - ENDED_PLANS_KEPT_MS)

    def _forget_ended(self, before_ms: int) -> None:
        """Forget the plans that ended before `before_ms`, oldest first, keeping their ids until they expired long
        ago (then also those)."""
        while self.ended and self.ended[0][0] < before_ms:
            _, batch_id = self.ended.popleft()
            plan = self.plans.pop(batch_id, None)
            if plan is not None:
                executors = {*plan.assignees.values(), *([plan.finalizer] if plan.finalizer else [])}
                self.forgotten[batch_id] = Forgotten((plan.terms.expires_at or 0) * 1000, frozenset(executors))
        while self.forgotten:
            batch_id, forgotten = next(iter(self.forgotten.items()))
            if forgotten.expires_at_ms >= before_ms - FORGOTTEN_IDS_KEPT_MS:
                break
            del self.forgotten[batch_id]

    @_plan_rules.on(BatchValidated)
    def _validated(self, plan: BatchPlan, event: BatchValidated) -> None:
        if plan.phase == "validating":
            self.validated_count += 1
            plan.validated_order = self.validated_count
            plan.validated_at_ms = event.occurred_at
            plan.phase = "validated"
            plan.queued_before = self.queued_lines.get(plan.owner, 0)
            self.queued_lines[plan.owner] = plan.queued_before + event.total_lines
        else:
            self.queued_lines[plan.owner] = self.queued_lines.get(plan.owner, 0) + event.total_lines - plan.total_lines
        plan.model, plan.total_lines = event.model, event.total_lines
        plan.rejections_object_key = event.rejections_object_key

    @_plan_rules.on(BatchAssigned)
    def _assigned(self, plan: BatchPlan, event: BatchAssigned) -> None:
        if plan.layout is None:
            plan.layout = event.layout
        plan.attempt = max(plan.attempt, event.attempt)
        plan.attempt_shard[event.attempt] = event.shard
        plan.assignees.setdefault(event.attempt, event.executor_id)
        run = plan.shard(event.shard)
        run.tried_executors.add(event.executor_id)
        if event.attempt >= run.attempt and event.attempt not in run.failed_attempts:
            run.attempt, run.executor_id, run.running_since_ms = event.attempt, event.executor_id, event.occurred_at
        plan.reindex(event.shard)

    @_plan_rules.on(BatchStarted)
    def _started(self, plan: BatchPlan, event: BatchStarted) -> None:
        run = plan.shard(plan.attempt_shard.get(event.attempt, 0))
        run.started_at.setdefault(event.attempt, event.occurred_at)
        if event.attempt == run.attempt and run.running:
            run.executor_id = event.executor_id
        plan.reindex(plan.attempt_shard.get(event.attempt, 0))

    @_plan_rules.on(AttemptFailed)
    def _attempt_failed(self, plan: BatchPlan, event: AttemptFailed) -> None:
        run = plan.shard(plan.attempt_shard.get(event.attempt, 0))
        run.failed_attempts.add(event.attempt)
        if event.attempt == run.attempt:
            run.executor_id = None
        plan.reindex(plan.attempt_shard.get(event.attempt, 0))
        started = run.started_at.get(event.attempt)
        if event.code in (PLACEMENT_WITHDRAWN, STORAGE_UNAVAILABLE) or (
                event.code == "executor_lost" and started is None) or (
                event.code == "executor_restarted"
                and (started is None or started >= self.incarnations.get(event.executor_id, 0))):
            run.unstarted_losses.add(event.attempt)

    @_plan_rules.on(BatchProgressed)
    def _progressed(self, plan: BatchPlan, event: BatchProgressed) -> None:
        unit = plan.attempt_shard.get(event.attempt, event.shard)
        plan.shard(unit).progressed_attempts.add(event.attempt)
        if event.chunk_key in plan.announced:
            return  # a repeat states no new lines
        plan.announced[event.chunk_key] = progress_statement(event)
        gained = event.completed + event.failed - plan.unit_done.get(unit, 0)  # counts are cumulative per unit
        if gained > 0:
            plan.unit_done[unit] = event.completed + event.failed
            plan.done_lines += gained
            if plan.model is not None:
                self.rates.note(plan.model, event.occurred_at, gained)

    @_plan_rules.on(ShardFinished)
    def _shard_finished(self, plan: BatchPlan, event: ShardFinished) -> None:
        shard = plan.attempt_shard.get(event.attempt, event.shard)  # the attempt's own, whatever the fact says
        run = plan.shard(shard)
        if event.attempt == run.attempt and event.attempt not in run.failed_attempts:
            run.executor_id = None
            run.finished = run.finished or not event.stopped
        plan.reindex(shard)

    @_plan_rules.on(BatchFinalizing)
    def _finalizing(self, plan: BatchPlan, event: BatchFinalizing) -> None:
        plan.finalizing = True

    @_plan_rules.on(BatchCancelRequested)
    def _cancel_requested(self, plan: BatchPlan, event: BatchCancelRequested) -> None:
        if plan.cancel_requested_at_ms is None:
            plan.cancel_requested_at_ms = event.occurred_at
        if event.code != "batch_cancelled":  # a revoked key, or credit run out: its code wins
            plan.cancel_code = event.code

    @_plan_rules.on(BatchReleased)
    def _released(self, plan: BatchPlan, event: BatchReleased) -> None:
        plan.held = False

    @_plan_rules.on(BatchWaiting)
    def _waiting(self, plan: BatchPlan, event: BatchWaiting) -> None:
        plan.waiting_reason, plan.waiting_at_ms = event.reason, event.occurred_at


def book_facts() -> tuple[type[Event], ...]:
    """The fact types the book has a rule for: what its fold of the log consumes."""
    folded = (*_fleet_rules.types(), *_plan_rules.types(), *PLACEMENT_FACTS)
    return tuple(dict.fromkeys(fact for fact in folded if issubclass(fact, Event)))
