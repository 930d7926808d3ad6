"""The Batches API's guards against a real gateway and ledger: idempotency, twins, limits, and clean 4xx."""

import asyncio
from collections.abc import AsyncIterator

import pytest

from contracts.ids import derived_id
from contracts.subjects import EVENTS_STREAM, batch_fact, read_model_key
from services.runtime.nats.facts import last_fact
from services.runtime.nats.kv import read_subject
from services.runtime.nats.readmodel import ReadModel
from services.runtime.process.settings import ConnectionSettings
from tests.integration.gateway_support import Gateway, jsonl, running_gateway

ACTIVE_LIMIT = 3
BURST = 30


@pytest.fixture(scope="module")
async def gateway(connection: ConnectionSettings) -> AsyncIterator[Gateway]:
    async with running_gateway(connection, max_active_batches=ACTIVE_LIMIT, control_call_burst=BURST,
                               control_calls_per_s=0.5) as running:
        yield running


async def new_file(gateway: Gateway, key: dict[str, str], tag: str) -> str:
    return str((await (await gateway.upload(key, jsonl(tag))).json())["id"])


def body(file_id: str, **extra: object) -> dict[str, object]:
    return {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h", **extra}


async def test_the_same_idempotency_key_and_body_return_the_same_batch(gateway: Gateway) -> None:
    key = await gateway.new_key()
    file_id = await new_file(gateway, key, "idem")
    headers = {**key, "Idempotency-Key": "retry-me-0123456789"}
    first = await (await gateway.client.post("/v1/batches", json=body(file_id), headers=headers)).json()
    again = await (await gateway.client.post("/v1/batches", json=body(file_id), headers=headers)).json()
    assert first["id"] == again["id"]


async def test_the_same_idempotency_key_with_another_body_is_a_conflict(gateway: Gateway) -> None:
    key = await gateway.new_key()
    file_id = await new_file(gateway, key, "idem-conflict")
    headers = {**key, "Idempotency-Key": "conflicting-key-0123"}
    assert (await gateway.client.post("/v1/batches", json=body(file_id), headers=headers)).status == 200
    other = await gateway.client.post("/v1/batches", json=body(file_id, metadata={"x": "y"}), headers=headers)
    assert other.status == 409
    assert (await other.json())["error"]["code"] == "idempotency_conflict"
    assert other.headers["x-should-retry"] == "false"


@pytest.mark.parametrize("idempotency_key", ["short", "k" * 81, "clé-de-réessai-0123"])
async def test_idempotency_keys_outside_16_to_80_printable_ascii_characters_are_refused(
        gateway: Gateway, idempotency_key: str) -> None:
    key = await gateway.new_key()
    response = await gateway.client.post("/v1/batches", json=body("file-x"),
                                         headers={**key, "Idempotency-Key": idempotency_key})
    assert response.status == 400
    assert (await response.json())["error"]["code"] == "invalid_idempotency_key"


async def test_a_key_retried_past_the_brokers_dedup_while_the_ledger_lags_states_its_batch_once(
        gateway: Gateway) -> None:
    """The batch of an Idempotency-Key is found in the log, not only in the read model: a retry minutes later, with
    the read model not showing the batch, is answered with it rather than state it again."""
    key = await gateway.new_key()
    file_id = await new_file(gateway, key, "late")
    first = await (await gateway.client.post("/v1/batches", json=body(file_id), headers=key)).json()
    read_model = await ReadModel.open(gateway.bus)
    record = await read_model.get_batch(first["id"])
    assert record is not None
    late_key = "retried-much-later-0123"
    batch_id = derived_id("batch_", record.owner, late_key)
    stated = await last_fact(gateway.bus, batch_fact(first["id"], "created"))
    assert stated is not None
    # The key's create as published minutes ago (an id of its own: past the dedup window), its record not shown.
    await gateway.bus.publish(stated[1].model_copy(update={"aggregate_id": batch_id, "event_id": "minutes-ago"}))
    # Folded (and nothing follows it: no validator runs here), then not shown, as by a ledger that lags.
    assert await read_model.wait_for(lambda: read_model.get_batch(batch_id), lambda _: True, 10) is not None
    await read_model.kv.delete(read_model_key("batch", batch_id))

    again = await gateway.client.post("/v1/batches", json=body(file_id), headers={**key, "Idempotency-Key": late_key})

    assert again.status == 200 and (await again.json())["id"] == batch_id
    assert len(await read_subject(gateway.bus.js, EVENTS_STREAM, batch_fact(batch_id, "created"))) == 1


async def test_creating_the_same_batch_while_the_first_is_alive_returns_the_first(gateway: Gateway) -> None:
    key = await gateway.new_key()
    file_id = await new_file(gateway, key, "twin")
    first = await (await gateway.client.post("/v1/batches", json=body(file_id), headers=key)).json()
    again = await (await gateway.client.post("/v1/batches", json=body(file_id), headers=key)).json()
    assert again["id"] == first["id"]


async def test_a_key_may_have_only_so_many_active_batches(gateway: Gateway) -> None:
    key = await gateway.new_key()
    for i in range(ACTIVE_LIMIT):
        created = await gateway.client.post("/v1/batches", json=body(await new_file(gateway, key, f"a{i}")),
                                            headers=key)
        assert created.status == 200
    refused = await gateway.client.post("/v1/batches", json=body(await new_file(gateway, key, "over")), headers=key)
    assert refused.status == 429
    assert (await refused.json())["error"]["code"] == "too_many_active_batches"


async def test_control_calls_past_the_burst_get_429_with_retry_after(gateway: Gateway) -> None:
    key = await gateway.new_key()
    statuses = [(await gateway.client.post("/v1/batches", json={}, headers=key)) for _ in range(BURST + 2)]
    assert [r.status for r in statuses[:BURST]] == [400] * BURST
    limited = statuses[-1]
    assert limited.status == 429 and int(limited.headers["Retry-After"]) >= 1
    assert (await limited.json())["error"]["code"] == "rate_limit_exceeded"
    reads = await gateway.client.get("/v1/batches", headers=key)
    assert reads.status == 200, "reads never count"


async def test_batch_list_pages_by_cursor(gateway: Gateway) -> None:
    key = await gateway.new_key()
    ids = []
    for i in range(3):
        created = await gateway.client.post("/v1/batches", json=body(await new_file(gateway, key, f"p{i}")),
                                            headers=key)
        ids.append((await created.json())["id"])
        await asyncio.sleep(1.01)  # distinct created_at, so newest-first is well defined
    page = await (await gateway.client.get("/v1/batches?limit=2", headers=key)).json()
    assert [b["id"] for b in page["data"]] == ids[:0:-1] and page["has_more"] is True
    assert (page["first_id"], page["last_id"]) == (ids[2], ids[1])
    rest = await (await gateway.client.get(f"/v1/batches?limit=2&after={ids[1]}", headers=key)).json()
    assert [b["id"] for b in rest["data"]] == [ids[0]] and rest["has_more"] is False


@pytest.mark.parametrize("path", ["/v1/files/..%2F..%2Fetc%2Fpasswd", "/v1/files/a%2Fb/content",
                                  "/v1/batches/..%2Fbatch", "/v1/batches/%2E%2E/cancel", "/v1/files/a%00b",
                                  "/v1/batches/" + "b" * 300, "/v1/files/a.b.c"])
async def test_path_like_ids_are_clean_404s(gateway: Gateway, path: str) -> None:
    key = await gateway.new_key()
    method = "POST" if path.endswith("/cancel") else "GET"
    response = await gateway.client.request(method, path, headers=key)
    assert response.status == 404
    assert (await response.json())["error"]["type"] == "not_found_error"


async def test_a_malformed_multipart_upload_is_a_clean_400(gateway: Gateway) -> None:
    key = await gateway.new_key()
    for raw in (b"--xyz\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\n{\"a\":1}",  # never closed
                b"garbage with no boundary at all", b"",
                b"--xyz\r\nContent-Disposition: form-data; name=\"\xc2\x9f\x08\"\r\n\r\nx\r\n--xyz--\r\n"):
        response = await gateway.client.post("/v1/files", data=raw, headers={
            **key, "Content-Type": "multipart/form-data; boundary=xyz"})
        assert 400 <= response.status < 500, raw
        assert set((await response.json())["error"]) == {"message", "type", "param", "code"}


async def test_an_oversized_json_body_is_a_413(gateway: Gateway) -> None:
    key = await gateway.new_key()
    response = await gateway.client.post("/v1/batches", data=b"{" + b" " * (2 * 1024 * 1024) + b"}",
                                         headers={**key, "Content-Type": "application/json"})
    assert response.status == 413
    assert (await response.json())["error"]["code"] == "request_too_large"


async def test_header_injection_through_a_filename_never_reaches_response_headers(gateway: Gateway) -> None:
    key = await gateway.new_key()
    raw = (b"--xyz\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
           b"--xyz\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.jsonl\r\nX-Evil: 1\"\r\n\r\n"
           + jsonl("inject") + b"\r\n--xyz--\r\n")
    response = await gateway.client.post("/v1/files", data=raw, headers={
        **key, "Content-Type": "multipart/form-data; boundary=xyz"})
    assert response.status < 500 and "X-Evil" not in response.headers
    if response.status == 200:
        content = await gateway.client.get(f"/v1/files/{(await response.json())['id']}/content", headers=key)
        assert "X-Evil" not in content.headers
