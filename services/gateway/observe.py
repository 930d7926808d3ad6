"""The gateway's tracing and metrics: a span and a count per request, and `/metrics` for Prometheus (admin keys
only; the unauthenticated operator address is `SHESHNAG_METRICS_PORT`)."""

import time

from aiohttp import web
from aiohttp.typedefs import Handler
from opentelemetry.trace import SpanKind
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from services.gateway.auth import require_admin
from services.runtime import metrics
from services.runtime.logfmt import BATCH_ID
from services.runtime.telemetry import extract_context, tracer

_tracer = tracer("gateway")


def _route(request: web.Request) -> str:
    """The route's pattern (`/v1/batches/{batch_id}`), never the raw path: labels stay few."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


@web.middleware
async def observe_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Starts (or continues, from `traceparent`) the request's trace; counts and times it by route and status."""
    route = _route(request)
    started = time.perf_counter()
    status = 500
    batch_token = BATCH_ID.set(request.match_info.get("batch_id", ""))
    with _tracer.start_as_current_span(f"{request.method} {route}", context=extract_context(request.headers),
                                       kind=SpanKind.SERVER,
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
    """Prometheus text format: this process's counters and the fleet-wide gauges as last refreshed
    (`fleet_gauges.py`); no read of NATS, whatever the number of batches."""
    require_admin(request, "Only an admin key may read the metrics.")
    return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})
