"""The ledger's part in each batch's trace and its fold metrics."""

from services.runtime.nats.follower import Fact
from services.runtime.process import metrics
from services.runtime.process.telemetry import TRACEPARENT, extract_context, tracer

_tracer = tracer("ledger")


def record_fold(facts: list[Fact], started_ns: int, ended_ns: int, head_seen: int) -> None:
    """One `ledger fold` span per trace in the group (not per fact: a bounded cost), child of its last fact folded."""
    last_of_trace: dict[str, Fact] = {}
    counts: dict[str, int] = {}
    for fact in facts:
        parent = (fact.headers or {}).get(TRACEPARENT)
        if parent:
            last_of_trace[parent[3:35]] = fact
            counts[parent[3:35]] = counts.get(parent[3:35], 0) + 1
    for trace_id, fact in last_of_trace.items():
        span = _tracer.start_span("ledger fold", context=extract_context(fact.headers), start_time=started_ns,
                                  attributes={"messaging.destination.name": fact.subject,
                                              "sheshnag.stream_sequence": fact.sequence,
                                              "sheshnag.facts_folded": counts[trace_id]})
        span.end(end_time=ended_ns)
    metrics.FOLDED_EVENTS.inc(len(facts))
    metrics.FOLD_LAG.set(max(head_seen - facts[-1].sequence, 0))
