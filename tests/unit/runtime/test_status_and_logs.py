"""The status view's terminal rendering and the JSON log lines' trace fields, without any server."""

import json
import logging

import pytest
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, use_span

from infra.status import bar, render
from services.gateway.usecases.overview import ConsumerLag, ExecutorView, Overview, QueuedBatch, RunningBatch
from services.runtime.process.logfmt import BATCH_ID, JsonFormatter, TraceFields
from services.runtime.process.telemetry import otlp_protocol


def test_status_shows_fleet_queue_reasons_progress_eta_and_lag() -> None:
    view = Overview(at=0.0, stream_last_seq=42, batches_by_status={"in_progress": 1, "validated": 1},
                    executors=[ExecutorView("gpu-7", "llamacpp", ["smollm2"], 4, 2**30, 2**31, 1.0)],
                    queued=[QueuedBatch("batch_q", "big-model", 75.0, "No executor serves big-model.")],
                    running=[RunningBatch("batch_r", "smollm2", "in_progress", 50, 100, 2.5, 20.0)],
                    consumers=[ConsumerLag("EVENTS", "validator", True, 3, 1)])
    text = render(view)
    assert "gpu-7" in text and "No executor serves big-model." in text and "1m15s" in text
    assert bar(50, 100) in text and "50/100" in text and "ETA 0m20s" in text
    assert "validator" in text and "3 / 1" in text


def test_json_log_lines_carry_batch_and_trace_ids() -> None:
    span = NonRecordingSpan(SpanContext(trace_id=0xABC, span_id=0xDEF, is_remote=False,
                                        trace_flags=TraceFlags(TraceFlags.SAMPLED)))
    record = logging.LogRecord("t", logging.INFO, __file__, 1, "hello %s", ("world",), None)
    token = BATCH_ID.set("batch_1")
    try:
        with use_span(span):
            TraceFields().filter(record)
    finally:
        BATCH_ID.reset(token)
    line = json.loads(JsonFormatter("executor").format(record))
    assert line["message"] == "hello world" and line["service"] == "executor" and line["batch_id"] == "batch_1"
    assert line["trace_id"] == f"{0xABC:032x}" and line["span_id"] == f"{0xDEF:016x}"


def test_json_log_lines_are_timed_in_iso_8601_utc() -> None:
    record = logging.LogRecord("t", logging.INFO, __file__, 1, "hello", (), None)
    record.created = 1_796_000_000.1234  # 2026-11-30T00:53:20.123 UTC
    line = json.loads(JsonFormatter("gateway").format(record))
    assert line["time"] == "2026-11-30T00:53:20.123Z"


@pytest.mark.parametrize(("variables", "protocol"), [
    ({}, "http/protobuf"),
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "grpc"),
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, "http/protobuf"),
])
def test_the_otlp_protocol_is_the_sdks_variables(variables: dict[str, str], protocol: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert otlp_protocol() == protocol
