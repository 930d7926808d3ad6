"""The executor's part in each batch's trace: one span per line's engine call, with model, tokens, slot wait."""

import time
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from prometheus_client import Counter, Gauge

from services.executor.adapters.engines.base import Engine, EngineReply
from services.executor.chunk_lines import body_tokens
from services.executor.retry import LineRetry, run_line
from services.executor.samples import run_samples
from services.runtime.process import metrics
from services.runtime.process.telemetry import tracer

_tracer = tracer("executor")


@dataclass(frozen=True)
class _ModelMetrics:
    """One model's metric children, looked up once (`labels` takes a lock and builds a key each call)."""

    model: str
    busy: Gauge
    errors: Counter
    tokens: Counter
    lines: dict[int, Counter]
    """By status class (2 for 2xx, ...)."""

    def executed(self, status_code: int) -> Counter:
        status_class = status_code // 100
        child = self.lines.get(status_class)
        if child is None:
            child = self.lines[status_class] = metrics.EXECUTED_LINES.labels(self.model, f"{status_class}xx")
        return child


_by_model: dict[str, _ModelMetrics] = {}


def _metrics_of(model: str) -> _ModelMetrics:
    found = _by_model.get(model)
    if found is None:
        found = _by_model[model] = _ModelMetrics(model, metrics.SLOTS_BUSY.labels(model),
                                                 metrics.ENGINE_ERRORS.labels(model),
                                                 metrics.COMPLETION_TOKENS.labels(model), {})
    return found


def tracing() -> bool:
    """Whether a tracer provider was installed (without one no span is made: each would be a no-op)."""
    return not isinstance(trace.get_tracer_provider(), (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


async def traced_line(engine: Engine, model: str, endpoint: str, custom_id: str, body: dict[str, object],
                      retry: LineRetry, slot_wait_s: float, traced: bool) -> EngineReply:
    """`run_line`, measured, in a child span of the run command's. `traced`: `tracing()`, asked once per attempt."""
    metrics.SLOT_WAIT.observe(slot_wait_s)
    measured = _metrics_of(model)
    if not traced:
        reply = await _measured(engine, endpoint, body, retry, measured)
    else:
        started = time.perf_counter()
        with _tracer.start_as_current_span(
                f"engine {endpoint}", kind=SpanKind.CLIENT,
                attributes={"gen_ai.request.model": model, "gen_ai.system": engine.name,
                            "sheshnag.custom_id": custom_id, "sheshnag.slot_wait_s": round(slot_wait_s, 4)}) as span:
            reply = await _measured(engine, endpoint, body, retry, measured)
            span.set_attribute("gen_ai.usage.output_tokens", body_tokens(reply.body)[1])
            span.set_attribute("http.response.status_code", reply.status_code)
            span.set_attribute("sheshnag.engine_s", round(time.perf_counter() - started, 4))
            if reply.status_code >= 500:
                span.set_status(Status(StatusCode.ERROR))
    measured.executed(reply.status_code).inc()
    measured.tokens.inc(body_tokens(reply.body)[1])
    return reply


async def _measured(engine: Engine, endpoint: str, body: dict[str, object], retry: LineRetry,
                    measured: _ModelMetrics) -> EngineReply:
    """The line's reply, counted among the busy slots while it runs; an engine error counted."""
    measured.busy.inc()
    try:
        reply = await run_samples(endpoint, body, lambda sample: run_line(engine, endpoint, sample, retry))
    except Exception:
        measured.errors.inc()
        raise
    finally:
        measured.busy.dec()
    if reply.status_code >= 500:
        measured.errors.inc()
    return reply
