"""The scheduler's part in each batch's trace: its acts run as children of the batch's latest fact."""

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from opentelemetry.context import Context

from contracts.lifecycle import ENDING_FACT_NAMES
from services.runtime.process.telemetry import attached, extract_context, tracer
from services.scheduler.decisions import Action, DeclareLost

_tracer = tracer("scheduler")
QUIET = frozenset({"line_rejected", "validation_progressed", "progressed"})
"""High-volume facts: the context of the fact before them is as good, and cheaper to keep."""


def remember_trace(traces: dict[str, Context], batch_id: str, event_name: str,
                   headers: Mapping[str, str] | None) -> None:
    if event_name in ENDING_FACT_NAMES:
        traces.pop(batch_id, None)
    elif event_name not in QUIET and headers and "traceparent" in headers:
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
