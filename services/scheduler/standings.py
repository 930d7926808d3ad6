"""Each open batch's standing as the `Wait` to state for it: its place and ETA (queued) or progress and ETA
(running), from the measured rates and the fair queue's order. Pure; the term asks every few seconds and states what
`should_republish` lets through, front of the queue first, at most `MOST_PER_PASS` (the log must not be flooded)."""

from services.scheduler.book import BatchPlan, Book
from services.scheduler.decisions import QUEUED, Wait
from services.scheduler.fair_share import QueuedBatch, Weights, standings
from services.scheduler.standing import queued_reason, running_reason, should_republish

STANDINGS_EVERY_MS = 5_000
"""How often the standings are worked out."""
MOST_PER_PASS = 200
"""Standings stated in one pass at most; the rest wait for the next."""
FIRST_STANDING_AFTER_MS = 2_000
"""A batch never told why it waits is told its place only this long after its validation (most are placed before)."""


def standing_waits(book: Book, weights: Weights, now_ms: int) -> list[Wait]:
    queued = [QueuedBatch(plan.batch_id, plan.owner, plan.organization_id, plan.model, plan.validated_order,
                          plan.expires_at_ms, pending_lines=0,
                          remaining_lines=max(plan.total_lines - plan.done_lines, 0))
              for plan in book.open.values() if plan.phase == "validated" and plan.model is not None
              and not plan.held and plan.cancel_requested_at_ms is None]
    waits: list[tuple[int, Wait]] = []
    for batch_id, standing in standings(queued, book.rates.rates(now_ms), weights).items():
        plan = book.open[batch_id]
        assert plan.model is not None
        if plan.running:
            executors = len({run.executor_id for _, run in plan.running_shards()})
            reason = running_reason(plan.done_lines, plan.total_lines, standing.eta_s, executors)
        elif _queued(plan, now_ms):
            reason = queued_reason(standing.position, plan.model, standing.eta_s)
        else:
            continue  # waiting for a reason of its own (no executor serves the model), or only just validated
        if should_republish(plan.waiting_reason, reason, plan.waiting_at_ms, now_ms):
            waits.append((standing.position, Wait(plan, reason)))
    waits.sort(key=lambda item: item[0])
    return [wait for _, wait in waits[:MOST_PER_PASS]]


def _queued(plan: BatchPlan, now_ms: int) -> bool:
    """Waiting for a free place: told so already, or never told otherwise (decisions state other reasons at once)
    and validated long enough ago not to be merely about to be placed."""
    if plan.waiting_reason is None:
        return now_ms - plan.validated_at_ms >= FIRST_STANDING_AFTER_MS
    return plan.waiting_reason.startswith(QUEUED)
