"""The executor's part in each batch's trace: one span per line's engine call, with model, tokens, slot wait."""

import time

from opentelemetry.trace import SpanKind, Status, StatusCode

from services.executor.adapters.engines.base import Engine, EngineReply
from services.executor.retry import LineRetry, run_line
from services.executor.samples import run_samples
from services.runtime import metrics
from services.runtime.telemetry import tracer

_tracer = tracer("executor")


def _completion_tokens(reply: EngineReply) -> int:
    usage = reply.body.get("usage")
    if isinstance(usage, dict):
        tokens = usage.get("completion_tokens", usage.get("output_tokens", 0))
        return tokens if isinstance(tokens, int) else 0
    return 0


async def traced_line(engine: Engine, model: str, endpoint: str, custom_id: str, body: dict[str, object],
                      retry: LineRetry, slot_wait_s: float) -> EngineReply:
    """`run_line`, measured: the span is a child of the run command's handler span, so it joins the batch."""
    metrics.SLOT_WAIT.observe(slot_wait_s)
    busy = metrics.SLOTS_BUSY.labels(model)
    busy.inc()
    started = time.perf_counter()
    with _tracer.start_as_current_span(
            f"engine {endpoint}", kind=SpanKind.CLIENT,
            attributes={"gen_ai.request.model": model, "gen_ai.system": engine.name, "sheshnag.custom_id": custom_id,
                        "sheshnag.slot_wait_s": round(slot_wait_s, 4)}) as span:
        try:
            reply = await run_samples(endpoint, body, lambda sample: run_line(engine, endpoint, sample, retry))
        except Exception:
            metrics.ENGINE_ERRORS.labels(model).inc()
            raise
        finally:
            busy.dec()
        tokens = _completion_tokens(reply)
        span.set_attribute("gen_ai.usage.output_tokens", tokens)
        span.set_attribute("http.response.status_code", reply.status_code)
        span.set_attribute("sheshnag.engine_s", round(time.perf_counter() - started, 4))
        if reply.status_code >= 500:
            metrics.ENGINE_ERRORS.labels(model).inc()
            span.set_status(Status(StatusCode.ERROR))
    metrics.EXECUTED_LINES.labels(model, f"{reply.status_code // 100}xx").inc()
    metrics.COMPLETION_TOKENS.labels(model).inc(tokens)
    return reply
