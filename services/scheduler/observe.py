"""The scheduler's metrics (whether it leads, its book's unfinished batches, what it did; labels are states, codes
and outcomes, never a batch, key, user or executor) and its acts' spans, children of each batch's latest fact."""

from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Literal, get_args

from opentelemetry.context import Context

from contracts.commands import RegistrationAnswer
from services.runtime.process import metrics
from services.runtime.process.telemetry import attached, extract_context, tracer
from services.scheduler.book import BatchPlan, Book
from services.scheduler.decisions import Action, Assign, DeclareLost, FenceAttempt

_tracer = tracer("scheduler")
QUIET = frozenset({"line_rejected", "validation_progressed", "progressed"})
"""High-volume facts: the context of the fact before them is as good, and cheaper to keep."""
PlanState = Literal["validating", "queued", "held", "running"]
PLAN_STATES: tuple[PlanState, ...] = get_args(PlanState)


def plan_state(plan: BatchPlan) -> PlanState:
    """Where an unfinished batch stands for the scheduler."""
    if plan.phase == "validating":
        return "validating"
    if plan.running:
        return "running"
    return "held" if plan.held else "queued"


def export_book(book: Book) -> None:
    """Set the batches gauge from the book (every state, 0 included: a drained queue reads 0, not absent)."""
    counts = Counter(plan_state(plan) for plan in book.open.values())
    for state in PLAN_STATES:
        metrics.SCHEDULER_BATCHES.labels(state).set(counts[state])


def leading(now: bool) -> None:
    """This process leads (`now`) or stands by; a standby's book is no one's view: it exports no batches."""
    metrics.SCHEDULER_LEADER.set(1 if now else 0)
    if not now:
        metrics.SCHEDULER_BATCHES.clear()


def note_action(action: Action, retry: bool = False) -> None:
    """Count an act the leader took (`retry`: an assignment of a unit that was tried before)."""
    if isinstance(action, Assign):
        metrics.SCHEDULER_ASSIGNMENTS.labels("retry" if retry else "first").inc()
    elif isinstance(action, FenceAttempt):
        metrics.SCHEDULER_FENCED.labels(action.code).inc()
    elif isinstance(action, DeclareLost):
        metrics.SCHEDULER_EXECUTORS_LOST.inc()


def note_registration(answer: RegistrationAnswer) -> RegistrationAnswer:
    outcome = "admitted" if answer.accepted else "retry" if answer.retry else "refused"
    metrics.SCHEDULER_REGISTRATIONS.labels(outcome).inc()
    return answer


def remember_trace(traces: dict[str, Context], batch_id: str, event_name: str,
                   headers: Mapping[str, str] | None) -> None:
    """An open batch's latest trace context (the term forgets the trace of a batch that is not open)."""
    if event_name not in QUIET and headers and "traceparent" in headers:
        traces[batch_id] = extract_context(headers)


@contextmanager
def action_span(traces: dict[str, Context], action: Action) -> Iterator[None]:
    if isinstance(action, DeclareLost):
        parent, attributes = Context(), {"sheshnag.executor_id": action.executor_id}
    else:
        parent = traces.get(action.plan.batch_id, Context())
        attributes = {"sheshnag.batch_id": action.plan.batch_id}
    with attached(parent), _tracer.start_as_current_span(f"schedule {type(action).__name__}", attributes=attributes):
        yield
