"""A read of the gateway (a batch, a list, an SSE stream) is a trace of its own, linked to its caller's span; a write
continues the caller's trace. A client polling a batch from inside the trace that created it adds no span to the
batch's trace."""

from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.gateway.http.observe import observe_middleware
from services.runtime.process.telemetry import configure_tracing

Client = TestClient[web.Request, web.Application]
CALLER_TRACE = 0x0AF7651916CD43DD8448EB211C80319C
CALLER_SPAN = 0xB7AD6B7169203331
TRACEPARENT = f"00-{CALLER_TRACE:032x}-{CALLER_SPAN:016x}-01"


@pytest.fixture(scope="module")
def exported() -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider):  # another test of this process installed the SDK's provider already
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        assert configure_tracing("tests", SimpleSpanProcessor(exporter))
    return exporter


async def ok(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


@pytest.fixture
async def client(exported: InMemorySpanExporter) -> AsyncIterator[Client]:
    app = web.Application(middlewares=[observe_middleware])
    app.router.add_routes([web.post("/v1/batches", ok), web.get("/v1/batches", ok),
                           web.get("/v1/batches/{batch_id}", ok), web.get("/v1/batches/{batch_id}/events", ok),
                           web.post("/v1/batches/{batch_id}/cancel", ok)])
    exported.clear()
    async with TestClient(TestServer(app)) as running:
        yield running


def span_named(exported: InMemorySpanExporter, name: str) -> ReadableSpan:
    [span] = [span for span in exported.get_finished_spans() if span.name == name]
    return span


@pytest.mark.parametrize("path", ["/v1/batches", "/v1/batches/batch_1", "/v1/batches/batch_1/events"])
async def test_a_read_starts_a_trace_of_its_own_linked_to_the_callers_span(
        client: Client, exported: InMemorySpanExporter, path: str) -> None:
    assert (await client.get(path, headers={"traceparent": TRACEPARENT})).status == 200
    [span] = exported.get_finished_spans()
    assert span.context is not None and span.context.trace_id != CALLER_TRACE
    assert span.parent is None
    [link] = span.links
    assert (link.context.trace_id, link.context.span_id) == (CALLER_TRACE, CALLER_SPAN)


async def test_a_read_without_a_caller_has_no_link(client: Client, exported: InMemorySpanExporter) -> None:
    assert (await client.get("/v1/batches/batch_1")).status == 200
    [span] = exported.get_finished_spans()
    assert span.parent is None and list(span.links) == []


@pytest.mark.parametrize(("path", "name"), [("/v1/batches", "POST /v1/batches"),
                                            ("/v1/batches/batch_1/cancel", "POST /v1/batches/{batch_id}/cancel")])
async def test_a_write_continues_the_callers_trace(client: Client, exported: InMemorySpanExporter, path: str,
                                                   name: str) -> None:
    assert (await client.post(path, headers={"traceparent": TRACEPARENT})).status == 200
    span = span_named(exported, name)
    assert span.context is not None and span.context.trace_id == CALLER_TRACE
    assert span.parent is not None and span.parent.span_id == CALLER_SPAN
