"""The gateway's tracing and metrics: a span and a count per request, and `/metrics` for Prometheus (admin keys). A
write continues the caller's trace (`traceparent`), so a batch's trace starts there; a read is a trace of its own,
linked to the caller's span, so a client polling from inside its trace does not bury the batch's spans."""

import time

from aiohttp import web
from aiohttp.typedefs import Handler
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanKind
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from services.runtime.process import metrics
from services.runtime.process.logfmt import BATCH_ID
from services.runtime.process.telemetry import extract_context, tracer

_tracer = tracer("gateway")
READS = frozenset({"GET", "HEAD", "OPTIONS"})
"""Methods whose requests never join the caller's trace as children (linked to it instead)."""


def parent_and_links(request: web.Request) -> tuple[Context, list[Link]]:
    """Where the request's span hangs: a write under the caller's span; a read in a trace of its own, linked."""
    caller = extract_context(request.headers)
    if request.method not in READS:
        return caller, []
    called_from = trace.get_current_span(caller).get_span_context()
    return Context(), [Link(called_from, {"sheshnag.link": "caller"})] if called_from.is_valid else []


@web.middleware
async def observe_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else "unmatched"  # never the raw path: labels stay few
    started = time.perf_counter()
    status = 500
    batch_token = BATCH_ID.set(request.match_info.get("batch_id", ""))
    parent, links = parent_and_links(request)
    with _tracer.start_as_current_span(f"{request.method} {route}", context=parent, kind=SpanKind.SERVER, links=links,
                                       attributes={"http.request.method": request.method, "http.route": route}) as span:
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as error:
            status = error.status
            raise
        finally:
            span.set_attribute("http.response.status_code", status)
            BATCH_ID.reset(batch_token)
            metrics.HTTP_REQUESTS.labels(request.method, route, str(status)).inc()
            metrics.HTTP_LATENCY.labels(request.method, route).observe(time.perf_counter() - started)


async def metrics_view(request: web.Request) -> web.Response:
    """This process's counters and the fleet-wide gauges as last refreshed: no read of NATS."""
    return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})
