"""What the scheduler should do now, given its book of batches and the live fleet: a pure function."""

from dataclasses import dataclass
from typing import Literal

from contracts.catalogue import Catalogue
from contracts.events.executor import ExecutorAdvert
from services.scheduler.book import BatchPlan, Book
from services.scheduler.domain import HEARTBEAT_FRESH_MS, choose_executor, why_unassignable

MAX_ATTEMPTS = 3
CANCEL_GRACE_MS = 30_000
"""How long a running attempt gets to wind down a cancel itself before it is fenced and finalized for it."""


@dataclass(frozen=True)
class Assign:
    plan: BatchPlan
    executor_id: str
    attempt: int


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
    plan: BatchPlan
    reason: Literal["cancelled", "expired"]


Action = Assign | Wait | FailBatch | FenceAttempt | DeclareLost | Finalize


def decide(book: Book, adverts: list[ExecutorAdvert], catalogue: Catalogue, now_ms: int) -> list[Action]:
    live = {advert.executor_id: advert for advert in adverts if advert.executor_id in book.admitted}
    # A just-registered executor may not have advertised yet: it is lost only once its heartbeat is stale.
    actions: list[Action] = [DeclareLost(executor_id, last_seen) for executor_id, last_seen
                             in book.known_executors.items()
                             if executor_id not in live and now_ms - last_seen > HEARTBEAT_FRESH_MS]
    for plan in book.plans.values():
        if plan.phase != "ended":
            actions += _decide_for(plan, live, catalogue, now_ms, book.incarnations)
    return actions


def _decide_for(plan: BatchPlan, live: dict[str, ExecutorAdvert], catalogue: Catalogue, now_ms: int,
                incarnations: dict[str, int]) -> list[Action]:
    running = plan.phase == "running" and plan.executor_id is not None
    if now_ms >= plan.expires_at * 1000:
        return _end_early(plan, running, "expired", "batch_expired", "The completion window ended.")
    if plan.cancel_requested_at_ms is not None:
        if running and now_ms - plan.cancel_requested_at_ms < CANCEL_GRACE_MS and plan.executor_id in live:
            return []  # the running attempt stops and finalizes the cancel itself
        return _end_early(plan, running, "cancelled", "batch_cancelled", "The batch was cancelled.")
    if running:
        assert plan.executor_id is not None
        if plan.executor_id not in live:
            return [FenceAttempt(plan, plan.attempt, plan.executor_id, "executor_lost",
                                 f"Executor {plan.executor_id} stopped sending heartbeats.")]
        if incarnations.get(plan.executor_id, 0) > plan.running_since_ms:
            return [FenceAttempt(plan, plan.attempt, plan.executor_id, "executor_restarted",
                                 f"Executor {plan.executor_id} restarted while running attempt {plan.attempt}.")]
        return []
    if plan.phase != "validated" or plan.model is None or plan.held:
        return []
    if len(plan.failed_attempts) >= MAX_ATTEMPTS:
        return [FailBatch(plan, "attempts_exhausted",
                          f"{MAX_ATTEMPTS} attempts failed; the last executors were "
                          f"{', '.join(sorted(plan.tried_executors))}.")]
    model = catalogue.resolve(plan.model)
    if model is None:
        return [FailBatch(plan, "model_unavailable", f"Model {plan.model} is no longer in the catalogue.")]
    fresh = [advert for advert in live.values() if advert.executor_id not in plan.tried_executors]
    chosen = choose_executor(model, fresh, now_ms) or choose_executor(model, live.values(), now_ms)
    if chosen is None:
        reason = why_unassignable(model, list(live.values()), now_ms)
        return [] if reason == plan.waiting_reason else [Wait(plan, reason)]
    return [Assign(plan, chosen.executor_id, plan.attempt + 1)]


def _end_early(plan: BatchPlan, running: bool, reason: Literal["cancelled", "expired"], code: str,
               message: str) -> list[Action]:
    actions: list[Action] = []
    if running and plan.executor_id is not None:
        actions.append(FenceAttempt(plan, plan.attempt, plan.executor_id, code, message))
    if plan.phase == "validating":
        return actions  # the verdict comes first; the file is not known to be readable yet
    if not plan.finalize_sent:
        actions.append(Finalize(plan, reason))
    return actions
