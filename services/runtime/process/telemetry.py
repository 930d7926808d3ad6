"""Tracing for every service: the tracer `sheshnag.<service>`, W3C context in NATS headers, and the provider chosen by
`OTEL_*` variables: `OTEL_TRACES_EXPORTER=otlp` (or an OTLP endpoint) exports over OTLP, `console` prints; else
nothing is exported, but context is still carried, so traces join across the services that do export."""

import importlib
import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagate import extract, inject
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

log = logging.getLogger(__name__)

TRACEPARENT = "traceparent"


def tracer(service: str) -> trace.Tracer:
    return trace.get_tracer(f"sheshnag.{service}")


def _exporter_from_env() -> SpanExporter | None:
    chosen = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if chosen == "console":
        return ConsoleSpanExporter()
    if chosen == "otlp" or (endpoint and chosen != "none"):
        return _otlp_exporter(otlp_protocol())
    return None


def otlp_protocol() -> str:
    """The OTLP protocol the SDK's variables choose: `http/protobuf` (the default), `grpc` or `http/json`."""
    return (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            or "http/protobuf").strip().lower()


def _otlp_exporter(protocol: str) -> SpanExporter | None:
    transport = {"grpc": "grpc", "http/protobuf": "http"}.get(protocol)
    if transport is None:
        log.warning("OTLP protocol %r is not supported (http/protobuf or grpc); no spans are exported", protocol)
        return None
    try:
        module = importlib.import_module(f"opentelemetry.exporter.otlp.proto.{transport}.trace_exporter")
    except ImportError:
        log.warning("OTLP export over %s asked for, but opentelemetry-exporter-otlp-proto-%s is not installed (pip "
                    "install it); no spans are exported", protocol, transport)
        return None
    exporter: SpanExporter = module.OTLPSpanExporter()
    return exporter


def configure_tracing(service: str, processor: SpanProcessor | None = None) -> bool:
    """Install the SDK's provider when an exporter is configured (or `processor` is given); True if installed.
    Without one, the API's no-op provider stays: incoming context is still passed on unchanged."""
    exporter = _exporter_from_env()
    if exporter is None and processor is None:
        return False
    provider = TracerProvider(resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME",
                                                                                       f"sheshnag-{service}")}))
    if exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    if processor is not None:
        provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    return True


def inject_headers(headers: dict[str, str]) -> dict[str, str]:
    """Add the current trace context (`traceparent`, `tracestate`) to outgoing message headers."""
    inject(headers)
    return headers


def extract_context(headers: Mapping[str, str] | None) -> Context:
    """The trace context a message or request carried (an empty one when it carried none)."""
    return extract(dict(headers or {}))


@contextmanager
def attached(ctx: Context) -> Iterator[None]:
    """Make `ctx` current for the block, e.g. to publish a fact as part of the trace that caused it."""
    token = otel_context.attach(ctx)
    try:
        yield
    finally:
        otel_context.detach(token)


def current_ids() -> tuple[str, str]:
    """(trace_id, span_id) of the current span in hex, or ("", "") outside any trace."""
    span_context = trace.get_current_span().get_span_context()
    if not span_context.is_valid:
        return "", ""
    return format(span_context.trace_id, "032x"), format(span_context.span_id, "016x")
