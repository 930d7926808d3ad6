"""`GET /v1/batches/{id}/events` against a real gateway, ledger and NATS: public frames, resume, ends, cleanup."""

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from contracts.api.batch_event import EVENT_FIELDS
from contracts.events.batch import BatchValidationFailed, ValidationProgressed
from contracts.subjects import EVENTS_STREAM, batch_events
from services.runtime.nats.bus import EventBus
from services.runtime.process.settings import ConnectionSettings
from tests.integration.gateway_support import Gateway, jsonl, running_gateway

DROPPED_STREAMS = 150
QUICKLY_S = 5.0


@pytest.fixture(scope="module")
async def gateway(connection: ConnectionSettings) -> AsyncIterator[Gateway]:
    async with running_gateway(connection, control_call_burst=1000) as running:
        yield running


async def new_batch(gateway: Gateway, key: dict[str, str], tag: str) -> str:
    file_id = (await (await gateway.upload(key, jsonl(tag))).json())["id"]
    created = await gateway.client.post("/v1/batches", headers=key, json={
        "input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"})
    assert created.status == 200
    return str((await created.json())["id"])


async def finished_batch(gateway: Gateway, key: dict[str, str], tag: str) -> str:
    batch_id = await new_batch(gateway, key, tag)
    await gateway.bus.publish(BatchValidationFailed(aggregate_id=batch_id, total_lines=1, error_count=1,
                                                    counts_by_code={"invalid_json": 1}))
    for _ in range(200):
        batch = await (await gateway.client.get(f"/v1/batches/{batch_id}", headers=key)).json()
        if batch["status"] == "failed":
            return batch_id
        await asyncio.sleep(0.05)
    raise AssertionError("the ledger never folded the verdict")


def frames(text: str) -> list[dict[str, str]]:
    parsed = []
    for block in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.split("\n") if line and not line.startswith(":"))
        if fields:
            parsed.append(fields)
    return parsed


async def read_stream(gateway: Gateway, batch_id: str, headers: dict[str, str]) -> str:
    """The whole stream; it must end by itself, soon."""
    response = await gateway.client.get(f"/v1/batches/{batch_id}/events", headers=headers)
    assert response.status == 200 and response.headers["x-request-id"].startswith("req_")
    return (await asyncio.wait_for(response.read(), QUICKLY_S)).decode()


async def test_a_finished_batch_streams_its_public_facts_and_ends(gateway: Gateway) -> None:
    key = await gateway.new_key()
    batch_id = await finished_batch(gateway, key, "ends")
    shown = frames(await read_stream(gateway, batch_id, key))
    assert [f["event"] for f in shown] == ["batch.created", "batch.validation_failed"]
    for frame in shown:
        data = json.loads(frame["data"])
        assert set(data) == {"type", "batch_id", "occurred_at", *EVENT_FIELDS[frame["event"]]}  # type: ignore[index]
        assert data["batch_id"] == batch_id
    created = json.loads(shown[0]["data"])
    assert "owner_key_id" not in created and "input_object_key" not in created and "allowed_models" not in created


@pytest.mark.parametrize("past_the_end", [0, 1, 1000])
async def test_resuming_at_or_past_the_end_of_a_finished_batch_closes_at_once(gateway: Gateway,
                                                                              past_the_end: int) -> None:
    key = await gateway.new_key()
    batch_id = await finished_batch(gateway, key, f"resume-{past_the_end}")
    last_id = int(frames(await read_stream(gateway, batch_id, key))[-1]["id"])
    text = await read_stream(gateway, batch_id, {**key, "Last-Event-ID": str(last_id + past_the_end)})
    assert frames(text) == []


async def test_resuming_before_the_end_streams_only_what_came_after(gateway: Gateway) -> None:
    key = await gateway.new_key()
    batch_id = await finished_batch(gateway, key, "resume-mid")
    first, last = frames(await read_stream(gateway, batch_id, key))
    rest = frames(await read_stream(gateway, batch_id, {**key, "Last-Event-ID": first["id"]}))
    assert rest == [last]


@pytest.mark.parametrize("last_event_id", ["18446744073709551617", "-1", "abc"])
async def test_a_last_event_id_that_is_no_sequence_is_a_400(gateway: Gateway, last_event_id: str) -> None:
    key = await gateway.new_key()
    batch_id = await new_batch(gateway, key, f"bad-id-{last_event_id}")
    response = await gateway.client.get(f"/v1/batches/{batch_id}/events",
                                        headers={**key, "Last-Event-ID": last_event_id})
    assert response.status == 400
    assert (await response.json())["error"]["code"] == "invalid_last_event_id"


async def stream_consumers(bus: EventBus, batch_id: str) -> int:
    subject, count, offset = batch_events(batch_id), 0, 0
    while True:
        page = await bus.js.consumers_info(EVENTS_STREAM, offset=offset)
        count += sum(1 for info in page if info.config.filter_subject == subject)
        if len(page) < 256:
            return count
        offset += len(page)


async def test_streams_whose_clients_vanish_leave_no_consumer_behind(gateway: Gateway) -> None:
    key = await gateway.new_key()
    batch_id = await new_batch(gateway, key, "dropped")  # never ends: only the clients going away end its streams
    server = gateway.client.server
    request = (f"GET /v1/batches/{batch_id}/events HTTP/1.1\r\nHost: x\r\n"
               f"Authorization: {key['Authorization']}\r\n\r\n").encode()

    async def connect() -> asyncio.StreamWriter:
        reader, writer = await asyncio.open_connection(server.host, server.port)
        writer.write(request)
        await asyncio.wait_for(reader.readuntil(b": connected\n\n"), 30)
        return writer

    writers = await asyncio.gather(*(connect() for _ in range(DROPPED_STREAMS)))
    assert await stream_consumers(gateway.bus, batch_id) == DROPPED_STREAMS
    for writer in writers:
        writer.transport.abort()
    left = DROPPED_STREAMS
    for _ in range(int(QUICKLY_S / 0.2)):
        left = await stream_consumers(gateway.bus, batch_id)
        if not left:
            break
        await asyncio.sleep(0.2)
    assert left == 0, f"{left} consumers outlived their clients by {QUICKLY_S} s"


async def test_a_large_backlog_streams_every_fact_once_in_order(gateway: Gateway) -> None:
    """A client that connects late to a busy batch gets every fact, none skipped (a push consumer past its pending
    limit drops messages; the stream reads the log with the ordered pull reader)."""
    key = await gateway.new_key()
    batch_id = await new_batch(gateway, key, "backlog")
    backlog = 3000
    for lines in range(1, backlog + 1):
        await gateway.bus.publish(ValidationProgressed(aggregate_id=batch_id, lines_read=lines, errors_found=0))
    await gateway.bus.publish(BatchValidationFailed(aggregate_id=batch_id, total_lines=backlog, error_count=1,
                                                    counts_by_code={"invalid_json": 1}))
    response = await gateway.client.get(f"/v1/batches/{batch_id}/events", headers=key)
    shown = frames((await asyncio.wait_for(response.read(), 30)).decode())
    progress = [json.loads(f["data"])["lines_read"] for f in shown if f["event"] == "batch.validation_progressed"]
    assert progress == list(range(1, backlog + 1))
    assert shown[-1]["event"] == "batch.validation_failed"
    ids = [int(f["id"]) for f in shown]
    assert ids == sorted(set(ids))
