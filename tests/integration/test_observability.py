"""One batch through all five services' real apps, in this process, on a broker of its own and the real model.

The services share one in-memory span exporter and one Prometheus registry here; each still talks to the others
only through NATS and S3, so the trace joins only where the context travels in message headers.
"""

import asyncio
import contextlib
import json
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import REGISTRY

from contracts.events.key import KeyCreated
from contracts.ids import hash_api_key
from infra.embedded import free_port, start_nats, stop_process
from services.executor.app import run_executor
from services.executor.settings import ExecutorSettings
from services.gateway.app import create_app as create_gateway
from services.gateway.background.fleet_gauges import BATCH_CENSUS, refresh_gauges
from services.gateway.context import DEPS
from services.gateway.settings import GatewaySettings
from services.ledger.app import create_app as create_ledger
from services.ledger.settings import LedgerSettings
from services.runtime.nats.bus import EventBus
from services.runtime.process.settings import ConnectionSettings
from services.runtime.process.telemetry import configure_tracing
from services.scheduler.app import run_scheduler
from services.scheduler.settings import SchedulerSettings
from services.validator.app import run_validator
from services.validator.settings import ValidatorSettings
from tests.conftest import RunningS3
from tests.integration.test_executor_run import MODEL_ID, TINY_CATALOGUE

LINES = 3
MAX_TOKENS = 4
EXPORTER = InMemorySpanExporter()
SERVICES = ("gateway", "validator", "scheduler", "executor", "ledger")


@dataclass
class Stack:
    client: TestClient
    headers: dict[str, str]
    admin: dict[str, str]


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture(scope="module")
def traced() -> InMemorySpanExporter:
    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider):  # another test of this process installed the SDK's provider already
        provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    else:
        assert configure_tracing("tests", SimpleSpanProcessor(EXPORTER)), "the SDK provider was not installed"
    return EXPORTER


@contextlib.asynccontextmanager
async def five_services(tmp_path: Path, s3_server: RunningS3) -> AsyncIterator[Stack]:
    port = free_port()
    nats_process = start_nats(tmp_path, port, tmp_path / "nats.log")
    catalogue = tmp_path / "catalogue.toml"
    catalogue.write_text(TINY_CATALOGUE)
    connection = ConnectionSettings(nats_url=f"nats://127.0.0.1:{port}", s3_endpoint=s3_server.endpoint,
                                    s3_access_key=s3_server.credentials.access_key,
                                    s3_secret_key=s3_server.credentials.secret_key,
                                    s3_bucket="sheshnag-observability", catalogue_path=catalogue)
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    bus = await EventBus.connect(connection.nats_url, "tests")
    user_key, worker_key, admin_key = (f"gk-{secrets.token_hex(16)}", f"wk-{secrets.token_hex(16)}",
                                       f"gk-{secrets.token_hex(16)}")
    for key, role in ((user_key, "user"), (worker_key, "worker"), (admin_key, "admin")):
        digest = hash_api_key(key)
        await bus.publish(KeyCreated(aggregate_id=digest[:32], key_sha256=digest, role=role, label=role))
    ledger = create_ledger(LedgerSettings(connection=connection))
    tasks.append(asyncio.create_task(ledger.run(stop)))
    await asyncio.wait_for(ledger.caught_up.wait(), 30)
    tasks.append(asyncio.create_task(run_validator(ValidatorSettings(connection=connection), stop)))
    tasks.append(asyncio.create_task(run_scheduler(SchedulerSettings(connection=connection, tick_s=0.2), stop)))
    executor = ExecutorSettings(connection=connection, executor_id="obs-0", worker_key=worker_key, chunk_lines=2,
                                heartbeat_s=0.5, stop_grace_s=1.0)
    tasks.append(asyncio.create_task(run_executor(executor, stop)))
    client = TestClient(TestServer(create_gateway(GatewaySettings(connection=connection))))
    await client.start_server()
    try:
        yield Stack(client, {"Authorization": f"Bearer {user_key}"}, {"Authorization": f"Bearer {admin_key}"})
    finally:
        await client.close()
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
        await bus.close()
        stop_process(nats_process)


async def run_one_batch(stack: Stack) -> dict[str, object]:
    lines = "".join(json.dumps({"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
                                "body": {"model": MODEL_ID, "max_tokens": MAX_TOKENS, "ignore_eos": True,
                                         "messages": [{"role": "user", "content": f"Count to {i}."}]}}) + "\n"
                    for i in range(LINES))
    form = aiohttp.FormData()
    form.add_field("purpose", "batch")
    form.add_field("file", lines.encode(), filename="in.jsonl", content_type="application/octet-stream")
    for _ in range(100):  # the ledger folds the key a moment after it is published
        uploaded = await stack.client.post("/v1/files", data=form, headers=stack.headers)
        if uploaded.status != 401:
            break
        await asyncio.sleep(0.1)
    assert uploaded.status == 200, await uploaded.text()
    file_id = (await uploaded.json())["id"]
    created = await stack.client.post("/v1/batches", headers=stack.headers, json={
        "input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"})
    assert created.status == 200, await created.text()
    batch: dict[str, object] = await created.json()
    for _ in range(1200):
        if batch["status"] in ("completed", "failed", "expired", "cancelled"):
            break
        await asyncio.sleep(0.1)
        batch = await (await stack.client.get(f"/v1/batches/{batch['id']}", headers=stack.headers)).json()
    assert batch["status"] == "completed", batch
    return batch


def _service(span: ReadableSpan) -> str:
    scope = span.instrumentation_scope
    return scope.name.removeprefix("sheshnag.") if scope is not None else ""


async def test_one_batch_is_one_trace_across_all_five_services_and_moves_the_counters(
        traced: InMemorySpanExporter, tmp_path: Path, s3_server: RunningS3) -> None:
    async with five_services(tmp_path, s3_server) as stack:
        # Counted from here: each service registers its metrics as it starts (other tests' counts stay out).
        before = {
            "created": _sample("sheshnag_http_requests_total", method="POST", route="/v1/batches", status="200"),
            "valid": _sample("sheshnag_validator_lines_total", outcome="valid"),
            "run": _sample("sheshnag_executor_lines_total", model=MODEL_ID, outcome="2xx"),
            "tokens": _sample("sheshnag_executor_completion_tokens_total", model=MODEL_ID),
            "folded": _sample("sheshnag_ledger_folded_events_total"),
        }
        traced.clear()
        batch = await run_one_batch(stack)
        await asyncio.sleep(1.0)  # the ledger folds the last facts just after the gateway sees `completed`
        # What the gateway's timer does every metrics_refresh_s:
        await refresh_gauges(stack.client.app[DEPS], stack.client.app[BATCH_CENSUS])
        scraped = await (await stack.client.get("/metrics", headers=stack.admin)).text()

    create_span = next(s for s in traced.get_finished_spans() if s.name == "POST /v1/batches")
    assert create_span.context is not None
    trace_id = create_span.context.trace_id
    spans = sorted((s for s in traced.get_finished_spans() if s.context and s.context.trace_id == trace_id),
                   key=lambda s: s.start_time or 0)
    assert {_service(s) for s in spans} >= set(SERVICES), sorted({_service(s) for s in spans})
    ids = {s.context.span_id for s in spans if s.context}
    orphans = [s.name for s in spans if s.parent is not None and s.parent.span_id not in ids]
    assert orphans == [], orphans  # every span's parent is in the same trace: nothing started a trace of its own

    def first(service: str, name: str) -> int:
        return next(s.start_time or 0 for s in spans if _service(s) == service and s.name.startswith(name))

    order = [first("gateway", "POST /v1/batches"), first("validator", "handle evt.batch.*.created"),
             first("scheduler", "schedule Assign"), first("executor", "handle cmd.executor.*.run"),
             first("executor", "engine /v1/chat/completions")]
    assert order == sorted(order)
    assert sum(1 for s in spans if s.name.startswith("engine ")) == LINES
    assert any(_service(s) == "ledger" and (s.start_time or 0) > order[-1] for s in spans)

    counts = batch["request_counts"]
    assert isinstance(counts, dict) and counts["completed"] == LINES
    assert _sample("sheshnag_http_requests_total", method="POST", route="/v1/batches",
                   status="200") - before["created"] == 1
    assert _sample("sheshnag_validator_lines_total", outcome="valid") - before["valid"] == LINES
    assert _sample("sheshnag_executor_lines_total", model=MODEL_ID, outcome="2xx") - before["run"] == LINES
    assert _sample("sheshnag_executor_completion_tokens_total", model=MODEL_ID) - before["tokens"] == \
        LINES * MAX_TOKENS
    assert _sample("sheshnag_ledger_folded_events_total") > before["folded"]
    assert 'sheshnag_batches{status="completed"} 1.0' in scraped
    assert 'sheshnag_jetstream_consumer_lag_messages{durable="validator",stream="EVENTS"} 0.0' in scraped
