"""What the scheduler should do now, given its book of batches and the live fleet: a pure function."""

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from contracts.catalogue import Catalogue, CatalogueModel
from contracts.events.batch import ShardLayout
from contracts.events.executor import ExecutorAdvert
from services.scheduler.book import BatchPlan, Book, ShardRun
from services.scheduler.domain import HEARTBEAT_FRESH_MS, choose_executor, eligible_executors, why_unassignable

MAX_ATTEMPTS = 3
"""Failed attempts of one shard that committed nothing, before the batch fails."""
CANCEL_GRACE_MS = 30_000
"""How long a running attempt gets to wind down a cancel itself before it is fenced and finalized for it."""
MAX_SHARDS = 16


@dataclass(frozen=True)
class Policy:
    """The operator's knobs the decisions follow."""

    shard_min_lines: int = 200
    """A batch is split only into shards of at least this many lines (and never more than the live executors
    that can serve it)."""
    max_queued_lines: int = 1_000_000
    """Lines an owner may have in validated or running batches; a batch past it fails at once."""


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
class FailBatch:
    plan: BatchPlan
    code: str
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
    """The batch's files are assembled and its end stated by `executor_id` alone."""

    plan: BatchPlan
    executor_id: str
    reason: Literal["completed", "cancelled", "expired", "failed"]
    failure_code: str | None = None
    """For `failed`: the cause, carried into the batch's `batch.failed` once its files are written."""
    failure_message: str | None = None


Action = Assign | Wait | FailBatch | FenceAttempt | DeclareLost | Finalize


def decide(book: Book, adverts: list[ExecutorAdvert], catalogue: Catalogue, now_ms: int,
           policy: Policy = Policy()) -> list[Action]:
    heard = book.last_heard(adverts)
    alive = {executor_id for executor_id, last_seen in heard.items() if now_ms - last_seen <= HEARTBEAT_FRESH_MS}
    # Work goes only where it may be committed: to admitted executors alive by the very measure that fences their
    # attempts (one declared lost gets no work until it heartbeats again). Lost once no heartbeat came for a while
    # (a just-registered executor may not have advertised yet, and one scan of the bucket may miss an advert).
    live = {advert.executor_id: advert for advert in adverts
            if advert.executor_id in book.admitted and advert.executor_id in alive}
    actions: list[Action] = [DeclareLost(executor_id, last_seen) for executor_id, last_seen in heard.items()
                             if executor_id not in alive]
    load = Counter(run.executor_id for plan in book.open_plans() for _, run in plan.running_shards())
    for plan in fair_order(book):
        actions += _decide_for(plan, book, live, alive, catalogue, now_ms, policy, load)
    return actions


def fair_order(book: Book) -> list[BatchPlan]:
    """The open batches in the order they get free capacity: owners take turns, fewest attempts running first, so a
    small batch of one owner does not wait for every batch another owner queued before it; FIFO within an owner."""
    running = Counter(plan.owner_key_id for plan in book.open_plans() for _ in plan.running_shards())
    turns: Counter[str] = Counter()
    keyed: list[tuple[int, int, BatchPlan]] = []
    for plan in sorted(book.open_plans(), key=lambda p: p.validated_order):
        waiting = plan.phase == "validated" and not plan.running
        keyed.append((running[plan.owner_key_id] + turns[plan.owner_key_id], plan.validated_order, plan))
        turns[plan.owner_key_id] += waiting
    return [plan for _, _, plan in sorted(keyed, key=lambda k: (k[0], k[1]))]


def _decide_for(plan: BatchPlan, book: Book, live: dict[str, ExecutorAdvert], alive: set[str], catalogue: Catalogue,
                now_ms: int, policy: Policy, load: Counter[str | None]) -> list[Action]:
    if now_ms >= plan.expires_at * 1000:
        return _end_early(plan, live, alive, now_ms, "expired", "batch_expired", "The completion window ended.")
    if plan.cancel_requested_at_ms is not None:
        return _end_early(plan, live, alive, now_ms, "cancelled", "batch_cancelled", "The batch was cancelled.")
    actions: list[Action] = _fence_dead_attempts(plan, book, alive)
    if plan.phase != "validated" or plan.model is None or plan.held:
        return actions
    if plan.all_finished:
        # Several shards finished: one finalizer assembles the files (a single shard finalizes itself).
        return actions if plan.running else [*actions, *_finalize(plan, live, alive, "completed")]
    for shard in plan.pending_shards():
        if plan.shard(shard).strikes >= MAX_ATTEMPTS:
            tried = ", ".join(sorted(plan.shard(shard).tried_executors))
            # Failed at run time: the other shards stop, then a finalizer delivers every committed line.
            return [*actions, *_end_early(plan, live, alive, now_ms, "failed", "attempts_exhausted",
                                          f"{MAX_ATTEMPTS} attempts failed without committing a line; the "
                                          f"executors tried were {tried}.")]
    model = catalogue.resolve(plan.model)
    if model is None:
        return [*actions, FailBatch(plan, "model_unavailable", f"Model {plan.model} is no longer in the catalogue.")]
    if plan.layout is None and book.queued_lines_before(plan) + plan.total_lines > policy.max_queued_lines:
        return [*actions, FailBatch(
            plan, "enqueued_request_limit_exceeded",
            f"This batch's {plan.total_lines} lines would bring your queued lines past the limit of "
            f"{policy.max_queued_lines}; wait for running batches to finish, or split the file.")]
    return actions + _assign_shards(plan, model, live, now_ms, policy, load)


def _fence_dead_attempts(plan: BatchPlan, book: Book, alive: set[str]) -> list[Action]:
    actions: list[Action] = []
    for _, run in plan.running_shards():
        assert run.executor_id is not None
        if run.executor_id not in alive:
            actions.append(FenceAttempt(plan, run.attempt, run.executor_id, "executor_lost",
                                        f"Executor {run.executor_id} stopped sending heartbeats."))
        elif book.incarnations.get(run.executor_id, 0) > run.running_since_ms:
            actions.append(FenceAttempt(plan, run.attempt, run.executor_id, "executor_restarted",
                                        f"Executor {run.executor_id} restarted while running attempt {run.attempt}."))
    return actions


def _assign_shards(plan: BatchPlan, model: CatalogueModel, live: dict[str, ExecutorAdvert], now_ms: int,
                   policy: Policy, load: Counter[str | None]) -> list[Action]:
    layout = plan.layout
    if layout is None:
        able = len(eligible_executors(model, live.values(), now_ms))
        wanted = min(MAX_SHARDS, able, plan.total_lines // max(policy.shard_min_lines, 1))
        layout = ShardLayout.split(plan.total_lines, wanted)
    # Two shards of one batch on one executor would only queue behind each other.
    busy = {run.executor_id for _, run in plan.running_shards()}
    actions: list[Action] = []
    attempt = plan.attempt
    for shard in plan.pending_shards() if plan.layout is not None else range(layout.shards):
        run = plan.shards.get(shard, ShardRun())
        # An executor runs at most its advertised attempts at once: more would only queue there, out of turn.
        free = [advert for advert in live.values()
                if advert.executor_id not in busy and load[advert.executor_id] < advert.parallel_attempts]
        fresh = [advert for advert in free if advert.executor_id not in run.tried_executors]
        chosen = choose_executor(model, fresh, now_ms) or choose_executor(model, free, now_ms)
        if chosen is None:
            break
        attempt += 1
        busy.add(chosen.executor_id)
        load[chosen.executor_id] += 1
        actions.append(Assign(plan, chosen.executor_id, attempt, shard, layout))
    if actions or plan.running:
        return actions
    capable = eligible_executors(model, live.values(), now_ms)
    if capable and all(load[advert.executor_id] >= advert.parallel_attempts for advert in capable):
        reason = f"Queued: every executor serving {model.id} is busy with other batches."
        return [] if reason == plan.waiting_reason else [Wait(plan, reason)]
    reason = why_unassignable(model, list(live.values()), now_ms)
    return [] if reason == plan.waiting_reason else [Wait(plan, reason)]


def _end_early(plan: BatchPlan, live: dict[str, ExecutorAdvert], alive: set[str], now_ms: int,
               reason: Literal["cancelled", "expired", "failed"], code: str, message: str) -> list[Action]:
    """Fence what runs (a cancel first gets a grace period to wind down itself), then finalize once."""
    actions: list[Action] = []
    winding_down = False
    for _, run in plan.running_shards():
        assert run.executor_id is not None
        in_grace = (reason == "cancelled" and plan.cancel_requested_at_ms is not None
                    and now_ms - plan.cancel_requested_at_ms < CANCEL_GRACE_MS and run.executor_id in live)
        if in_grace:
            winding_down = True
        else:
            actions.append(FenceAttempt(plan, run.attempt, run.executor_id, code, message))
    if winding_down or plan.phase == "validating":
        # A running attempt stops and finalizes the cancel itself (or, sharded, reports its shard stopped);
        # before the verdict the file is not known to be readable.
        return actions
    if reason == "failed":
        return [*actions, *_finalize(plan, live, alive, reason, code, message)]
    return [*actions, *_finalize(plan, live, alive, reason)]


def _finalize(plan: BatchPlan, live: dict[str, ExecutorAdvert], alive: set[str],
              reason: Literal["completed", "cancelled", "expired", "failed"], failure_code: str | None = None,
              failure_message: str | None = None) -> list[Action]:
    """Finalize once, by one executor; again by another once the one chosen is no longer heard from (it may have
    died with the command). None live: decided again next tick."""
    if plan.finalizer is not None and plan.finalizer in alive:
        return []
    chosen = choose_finalizer(plan, live)
    return [] if chosen is None else [Finalize(plan, chosen, reason, failure_code, failure_message)]


def choose_finalizer(plan: BatchPlan, live: dict[str, ExecutorAdvert]) -> str | None:
    """The live executor of the batch's latest attempt that has one (it already holds the batch's data), else the
    first live one by id (deterministic: a new leader, sending it again, mostly chooses the same); None when none
    is live."""
    for attempt in sorted(plan.assignees, reverse=True):
        if plan.assignees[attempt] in live:
            return plan.assignees[attempt]
    return min(live, default=None)
