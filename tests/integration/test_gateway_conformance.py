"""OpenAI conformance at the edges, against a real gateway: request ids everywhere, JSON errors even for requests
aiohttp cannot parse, strict parameters, and clients that vanish mid-request."""

import asyncio
import json
import logging
from collections.abc import AsyncIterator

import pytest

from services.runtime.process.settings import ConnectionSettings
from tests.integration.gateway_support import Gateway, jsonl, raw_exchange, running_gateway

ERROR_FIELDS = {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
async def gateway(connection: ConnectionSettings) -> AsyncIterator[Gateway]:
    async with running_gateway(connection, control_call_burst=1000) as running:
        yield running


def batch_body(file_id: str, **extra: object) -> dict[str, object]:
    return {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h", **extra}


async def test_every_response_carries_a_request_id_errors_and_404s_included(gateway: Gateway) -> None:
    key = await gateway.new_key()
    answers = [await gateway.client.get("/v1/models", headers=key),
               await gateway.client.get("/v1/models"),
               await gateway.client.get("/v1/batches/batch_nope", headers=key),
               await gateway.client.get("/v1/no/such/route", headers=key),
               await gateway.client.get("/healthz")]
    assert [a.status for a in answers] == [200, 401, 404, 404, 200]
    ids = [a.headers.get("x-request-id", "") for a in answers]
    assert all(ident.startswith("req_") for ident in ids) and len(set(ids)) == len(ids)


@pytest.mark.parametrize(("method", "path"), [("GET", "/v1/nope"), ("POST", "/v1/chat/completions"),
                                             ("POST", "/v1/embeddings"), ("GET", "/v1/files/file-1/content/more")])
async def test_an_unknown_route_under_v1_is_an_openai_shaped_404_naming_what_this_deployment_serves(
        gateway: Gateway, method: str, path: str) -> None:
    answer = await gateway.client.request(method, path, headers=await gateway.new_key())
    assert answer.status == 404
    error = (await answer.json())["error"]
    assert set(error) == ERROR_FIELDS and error["type"] == "not_found_error" and error["param"] is None
    assert f"{method} {path}" in error["message"]
    assert "This deployment serves the Batch API: /v1/files, /v1/batches, /v1/models" in error["message"]


async def test_an_inference_endpoint_is_answered_with_how_to_send_it_as_a_batch(gateway: Gateway) -> None:
    answer = await gateway.client.post("/v1/chat/completions", json={"model": "smollm2", "messages": []},
                                       headers=await gateway.new_key())
    message = (await answer.json())["error"]["message"]
    assert answer.status == 404 and 'endpoint "/v1/chat/completions" on /v1/batches' in message


@pytest.mark.parametrize(("method", "path", "allowed"), [("POST", "/v1/models", "GET, HEAD"),
                                                         ("DELETE", "/v1/batches", "GET, HEAD, POST"),
                                                         ("PUT", "/v1/files/file-1", "DELETE, GET, HEAD"),
                                                         ("GET", "/v1/batches/quote", "POST")])  # not a batch id
async def test_a_known_path_with_a_wrong_method_is_an_openai_shaped_405_with_allow(
        gateway: Gateway, method: str, path: str, allowed: str) -> None:
    answer = await gateway.client.request(method, path, headers=await gateway.new_key())
    assert answer.status == 405
    assert sorted(answer.headers["Allow"].split(",")) == allowed.split(", ")
    error = (await answer.json())["error"]
    assert set(error) == ERROR_FIELDS and (error["type"], error["code"]) == ("invalid_request_error",
                                                                             "method_not_allowed")
    assert error["message"] == f"{method} is not allowed on {path}; it answers {allowed}."


async def test_an_authorization_header_with_a_non_utf8_byte_is_a_401(gateway: Gateway) -> None:
    answer = await raw_exchange(gateway, b"GET /v1/files HTTP/1.1\r\nHost: x\r\n"
                                         b"Authorization: Bearer gk-\xff\xfe\r\nConnection: close\r\n\r\n")
    assert answer.status == 401
    assert answer.headers["content-type"].startswith("application/json")


async def test_a_json_body_that_arrives_in_several_segments_is_read_whole(gateway: Gateway) -> None:
    key = await gateway.new_key()
    body = json.dumps({"url": "https://example.com/hook", "description": "d" * 500}).encode()
    head = (f"POST /v1/webhooks HTTP/1.1\r\nHost: x\r\nAuthorization: {key['Authorization']}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    answer = await raw_exchange(gateway, head + body[:20], 10.0, body[20:300], body[300:])
    assert answer.status == 200, answer.body
    assert json.loads(answer.body)["url"] == "https://example.com/hook"


async def test_a_form_field_that_arrives_in_several_segments_is_read_whole(gateway: Gateway) -> None:
    key = await gateway.new_key()
    boundary = "segmented-boundary"
    form = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n"
            f"Content-Type: application/octet-stream\r\n\r\n").encode() + jsonl("segmented") + \
        f"\r\n--{boundary}--\r\n".encode()
    head = (f"POST /v1/files HTTP/1.1\r\nHost: x\r\nAuthorization: {key['Authorization']}\r\n"
            f"Content-Type: multipart/form-data; boundary={boundary}\r\nContent-Length: {len(form)}\r\n"
            f"Connection: close\r\n\r\n").encode()
    cut = form.index(b"batch") + 2  # "ba" | "tch"
    answer = await raw_exchange(gateway, head + form[:cut], 10.0, form[cut:])
    assert answer.status == 200, answer.body
    assert json.loads(answer.body)["purpose"] == "batch"


@pytest.mark.parametrize("request_bytes", [
    b"GET /v1/files HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 9000 + b"\r\n\r\n",
    b"GET /v1/" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    b"NOT A REQUEST LINE\r\n\r\n",
    b"GET /v1/files HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
], ids=["header-too-long", "url-too-long", "bad-request-line", "malformed-header"])
async def test_requests_aiohttp_cannot_parse_get_an_openai_shaped_json_400(gateway: Gateway,
                                                                           request_bytes: bytes) -> None:
    answer = await raw_exchange(gateway, request_bytes)
    assert answer.status == 400
    assert answer.headers["content-type"].startswith("application/json")
    assert answer.headers["x-request-id"].startswith("req_")
    error = json.loads(answer.body)["error"]
    assert set(error) == ERROR_FIELDS and error["type"] == "invalid_request_error" and error["code"] == "bad_request"


@pytest.mark.parametrize("path", ["/v1/batches?after=batch_unknown", "/v1/files?after=file-unknown"])
async def test_an_after_cursor_that_names_nothing_in_the_list_is_a_400(gateway: Gateway, path: str) -> None:
    key = await gateway.new_key()
    await gateway.upload(key, jsonl("cursor"))
    response = await gateway.client.get(path, headers=key)
    assert response.status == 400
    assert (await response.json())["error"]["code"] == "invalid_after"


async def test_files_list_takes_limits_up_to_10000_and_batches_up_to_100(gateway: Gateway) -> None:
    key = await gateway.new_key()
    assert (await gateway.client.get("/v1/files?limit=10000", headers=key)).status == 200
    assert (await gateway.client.get("/v1/files?limit=10001", headers=key)).status == 400
    assert (await gateway.client.get("/v1/batches?limit=100", headers=key)).status == 200
    assert (await gateway.client.get("/v1/batches?limit=101", headers=key)).status == 400


async def test_an_unknown_top_level_field_on_batch_create_is_a_400_naming_it(gateway: Gateway) -> None:
    key = await gateway.new_key()
    file_id = (await (await gateway.upload(key, jsonl("unknown-field"))).json())["id"]
    refused = await gateway.client.post("/v1/batches", json=batch_body(file_id, temperature=0.5), headers=key)
    assert refused.status == 400
    error = (await refused.json())["error"]
    assert (error["code"], error["param"]) == ("unknown_parameter", "temperature")
    extended = await gateway.client.post("/v1/batches", headers=key, json=batch_body(
        file_id, metadata={"a": "b"}, output_expires_after={"anchor": "created_at", "seconds": 3600},
        allow_partial=True, hold=True))
    assert extended.status == 200


@pytest.mark.parametrize("window", ["\uff12\uff14h", "\u00b2h"])
async def test_a_completion_window_in_non_ascii_digits_is_a_400(gateway: Gateway, window: str) -> None:
    key = await gateway.new_key()
    file_id = (await (await gateway.upload(key, jsonl(f"window-{window}"))).json())["id"]
    refused = await gateway.client.post("/v1/batches", json=batch_body(file_id, completion_window=window),
                                        headers=key)
    assert refused.status == 400
    assert (await refused.json())["error"]["code"] == "invalid_completion_window"


async def test_a_client_that_drops_mid_upload_is_logged_as_gone_not_as_an_error(
        gateway: Gateway, caplog: pytest.LogCaptureFixture) -> None:
    key = await gateway.new_key()
    server = gateway.client.server
    head = (f"POST /v1/files HTTP/1.1\r\nHost: x\r\nAuthorization: {key['Authorization']}\r\n"
            "Content-Type: multipart/form-data; boundary=cut\r\nContent-Length: 10000000\r\n\r\n").encode()
    body = (b'--cut\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            b'--cut\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
            b"Content-Type: application/octet-stream\r\n\r\n" + jsonl(*(f"line-{n}" for n in range(2000))))
    caplog.set_level(logging.INFO)
    _, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(head + body)
    await writer.drain()
    await asyncio.sleep(0.5)  # the gateway is streaming the file part into the object store
    writer.transport.abort()
    for _ in range(100):
        if any("client went away" in r.getMessage() for r in caplog.records):
            break
        await asyncio.sleep(0.05)
    assert any("client went away" in r.getMessage() for r in caplog.records)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


@pytest.mark.parametrize(("query", "code"), [("status=bogus", "invalid_status"),
                                             ("search=" + "x" * 513, "invalid_search")])
async def test_a_batches_filter_out_of_its_documented_values_is_a_400_even_on_an_empty_list(
        gateway: Gateway, query: str, code: str) -> None:
    answer = await gateway.client.get(f"/v1/batches?{query}", headers=await gateway.new_key())
    assert answer.status == 400 and (await answer.json())["error"]["code"] == code


async def test_a_head_of_a_download_or_an_event_stream_answers_headers_and_no_body(gateway: Gateway) -> None:
    key = await gateway.new_key()
    content = jsonl("a", "b")
    file_id = (await (await gateway.upload(key, content)).json())["id"]
    batch = await gateway.client.post("/v1/batches", json=batch_body(file_id), headers=key)
    batch_id = (await batch.json())["id"]
    server, auth = gateway.client.server, f"Authorization: {key['Authorization']}\r\n"
    for path, length in ((f"/v1/files/{file_id}/content", str(len(content))), (f"/v1/batches/{batch_id}/events", None)):
        reader, writer = await asyncio.open_connection(server.host, server.port)
        try:
            # Then a GET on the same connection: a body after the HEAD's headers would be read as its status line.
            writer.write(f"HEAD {path} HTTP/1.1\r\nHost: x\r\n{auth}\r\n"
                         f"GET /v1/files/{file_id} HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode())
            await writer.drain()
            head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).decode("latin-1")
            after = await asyncio.wait_for(reader.readuntil(b"\r\n"), 10)
        finally:
            writer.close()
        assert head.startswith("HTTP/1.1 200"), head
        assert length is None or f"Content-Length: {length}" in head, head
        assert after.startswith(b"HTTP/1.1 200"), (path, after)
