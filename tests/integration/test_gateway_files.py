"""The Files API against a real gateway, ledger, NATS and S3: dedup, digests, expiry, quota, in-use deletes."""

import time
from collections.abc import AsyncIterator

import orjson
import pytest

from contracts.api.file import MAX_FILENAME
from contracts.api.model import MAX_MODEL_NAME
from services.gateway.background.sweeper import sweep_expired_files
from services.gateway.context import DEPS
from services.runtime.process.settings import ConnectionSettings
from tests.integration.gateway_support import Gateway, jsonl, raw_exchange, running_gateway, sha256

QUOTA = 64 * 1024
THIRTY_DAYS = 30 * 24 * 3600
BOUNDARY = "b0undary"


def multipart_upload(filename: bytes, content: bytes) -> bytes:
    """A form as a client might send it whose file part's name is any bytes (aiohttp's own client writes UTF-8)."""
    return (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--{BOUNDARY}\r\n"
            ).encode() + b'Content-Disposition: form-data; name="file"; filename="' + filename + \
        b'"\r\nContent-Type: application/octet-stream\r\n\r\n' + content + f"\r\n--{BOUNDARY}--\r\n".encode()


@pytest.fixture(scope="module")
async def gateway(connection: ConnectionSettings) -> AsyncIterator[Gateway]:
    async with running_gateway(connection, storage_quota_bytes=QUOTA) as running:
        yield running


async def test_the_same_content_uploaded_twice_returns_the_first_file(gateway: Gateway) -> None:
    key = await gateway.new_key()
    first = await gateway.upload(key, jsonl("a", "b"))
    again = await gateway.upload(key, jsonl("a", "b"))
    assert first.status == again.status == 200
    assert (await again.json())["id"] == (await first.json())["id"]
    assert again.headers["X-Sheshnag-Deduplicated-From"] == (await first.json())["id"]
    assert "X-Sheshnag-Deduplicated-From" not in first.headers


async def test_another_owner_uploading_the_same_content_gets_a_file_of_its_own(gateway: Gateway) -> None:
    alice, bob = await gateway.new_key(), await gateway.new_key()
    mine = await (await gateway.upload(alice, jsonl("shared"))).json()
    theirs = await gateway.upload(bob, jsonl("shared"))
    assert (await theirs.json())["id"] != mine["id"]
    assert "X-Sheshnag-Deduplicated-From" not in theirs.headers


async def test_content_downloads_with_its_sha256(gateway: Gateway) -> None:
    key = await gateway.new_key()
    content = jsonl("x", "y", "z")
    file = await (await gateway.upload(key, content)).json()
    download = await gateway.client.get(f"/v1/files/{file['id']}/content", headers=key)
    assert await download.read() == content
    assert download.headers["X-Sheshnag-Content-SHA256"] == sha256(content)


async def test_a_download_is_an_attachment_named_as_the_file_was_uploaded(gateway: Gateway) -> None:
    key = await gateway.new_key()
    file = await (await gateway.upload(key, jsonl("named"), filename="prompts-2026.jsonl")).json()
    download = await gateway.client.get(f"/v1/files/{file['id']}/content", headers=key)
    assert download.headers["Content-Disposition"] == 'attachment; filename="prompts-2026.jsonl"'


async def test_a_non_ascii_or_quoted_file_name_downloads_with_a_safe_fallback_and_rfc_6266_filename_star(
        gateway: Gateway) -> None:
    key = await gateway.new_key()
    name = 'données "été".jsonl'
    # Raw UTF-8 in the quoted filename, as browsers send it (aiohttp's own form encoding would percent-escape it).
    body = ('--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            '--b\r\nContent-Disposition: form-data; name="file"; filename="donn\u00e9es \\"\u00e9t\u00e9\\".jsonl"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n").encode() + jsonl("accents") + b"\r\n--b--\r\n"
    uploaded = await gateway.client.post("/v1/files", data=body, headers={
        **key, "Content-Type": "multipart/form-data; boundary=b"})
    file = await uploaded.json()
    assert uploaded.status == 200 and file["filename"] == name
    download = await gateway.client.get(f"/v1/files/{file['id']}/content", headers=key)
    disposition = download.headers["Content-Disposition"]
    assert disposition == ("attachment; filename=\"donn_es __t__.jsonl\"; "
                           "filename*=UTF-8''donn%C3%A9es%20%22%C3%A9t%C3%A9%22.jsonl")
    assert disposition.isascii() and "\r" not in disposition and "\n" not in disposition


async def test_a_batch_file_expires_after_thirty_days_by_default(gateway: Gateway) -> None:
    key = await gateway.new_key()
    file = await (await gateway.upload(key, jsonl("ttl"))).json()
    assert file["expires_at"] - file["created_at"] == THIRTY_DAYS


async def test_the_sdks_expires_after_fields_set_the_expiry(gateway: Gateway) -> None:
    key = await gateway.new_key()
    response = await gateway.upload(key, jsonl("short"), **{"expires_after[anchor]": "created_at",
                                                           "expires_after[seconds]": "7200"})
    file = await response.json()
    assert file["expires_at"] - file["created_at"] == 7200


async def test_an_expires_after_out_of_range_is_refused(gateway: Gateway) -> None:
    key = await gateway.new_key()
    response = await gateway.upload(key, jsonl("bad"), **{"expires_after[anchor]": "created_at",
                                                         "expires_after[seconds]": "5"})
    assert response.status == 400
    assert (await response.json())["error"]["code"] == "invalid_expires_after"


async def test_the_sweeper_deletes_expired_files_once(gateway: Gateway) -> None:
    key = await gateway.new_key()
    file = await (await gateway.upload(key, jsonl("sweep-me"))).json()
    deps = gateway.client.app[DEPS]
    later = time.time() + THIRTY_DAYS + 1
    assert file["id"] in await sweep_expired_files(deps, now=later)
    assert file["id"] not in await sweep_expired_files(deps, now=later)
    assert (await gateway.client.get(f"/v1/files/{file['id']}", headers=key)).status == 404
    assert await deps.store.list_keys(f"files/{file['id']}") == []


async def test_an_input_file_of_a_live_batch_cannot_be_deleted(gateway: Gateway) -> None:
    key = await gateway.new_key()
    file = await (await gateway.upload(key, jsonl("in-use"))).json()
    batch = await gateway.client.post("/v1/batches", headers=key, json={
        "input_file_id": file["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"})
    assert batch.status == 200
    refused = await gateway.client.delete(f"/v1/files/{file['id']}", headers=key)
    assert refused.status == 409
    assert (await refused.json())["error"]["code"] == "file_in_use"
    assert refused.headers["x-should-retry"] == "false"


async def test_a_file_no_batch_uses_is_deleted_and_gone(gateway: Gateway) -> None:
    key = await gateway.new_key()
    file = await (await gateway.upload(key, jsonl("bye"))).json()
    deleted = await gateway.client.delete(f"/v1/files/{file['id']}", headers=key)
    assert await deleted.json() == {"id": file["id"], "object": "file", "deleted": True}
    assert (await gateway.client.get(f"/v1/files/{file['id']}/content", headers=key)).status == 404


async def test_uploads_past_the_owners_storage_quota_are_refused(gateway: Gateway) -> None:
    key = await gateway.new_key()
    big = jsonl(*(f"line-{i:05d}-{'x' * 200}" for i in range(70)))  # ~38 KiB
    assert len(big) > QUOTA // 2
    assert (await gateway.upload(key, big)).status == 200
    refused = await gateway.upload(key, big.replace(b"line-", b"more-"))
    assert refused.status == 400
    assert (await refused.json())["error"]["code"] == "storage_quota_exceeded"
    assert (await gateway.upload(await gateway.new_key(), big)).status == 200, "the quota is per owner"


async def test_files_list_pages_by_cursor_in_either_order(gateway: Gateway) -> None:
    key = await gateway.new_key()
    ids = []
    for i in range(3):
        ids.append((await (await gateway.upload(key, jsonl(f"page-{i}"))).json())["id"])
    first = await (await gateway.client.get("/v1/files?limit=2&order=asc", headers=key)).json()
    assert [f["id"] for f in first["data"]] == ids[:2] and first["has_more"] is True
    assert (first["first_id"], first["last_id"]) == (ids[0], ids[1])
    rest = await (await gateway.client.get(f"/v1/files?limit=2&order=asc&after={ids[1]}", headers=key)).json()
    assert [f["id"] for f in rest["data"]] == ids[2:] and rest["has_more"] is False
    newest = await (await gateway.client.get("/v1/files?limit=1", headers=key)).json()
    assert newest["data"][0]["id"] == ids[2]
    assert (await (await gateway.client.get("/v1/files?purpose=batch_output", headers=key)).json())["data"] == []
    assert (await (await gateway.client.get("/v1/files?purpose=evals", headers=key)).json())["data"] == []


async def test_files_uploaded_within_one_second_list_newest_first(gateway: Gateway) -> None:
    """`created_at` is in seconds: several uploads in one second still list in the order they were made."""
    key = await gateway.new_key()
    ids = [(await (await gateway.upload(key, jsonl(f"burst-{i}"))).json())["id"] for i in range(6)]
    listed = await (await gateway.client.get("/v1/files?limit=6", headers=key)).json()
    assert [f["id"] for f in listed["data"]] == ids[::-1]
    assert [f["id"] for f in (await (await gateway.client.get("/v1/files?order=asc", headers=key)).json())["data"]] \
        == ids
    newest = await (await gateway.client.get("/v1/files?limit=1", headers=key)).json()
    assert newest["data"][0]["id"] == ids[-1]


@pytest.mark.parametrize("order", ["asc", "desc"])
async def test_a_cleanup_loop_that_deletes_what_it_lists_pages_on_past_its_deleted_cursor(gateway: Gateway,
                                                                                         order: str) -> None:
    key = await gateway.new_key()
    uploaded = {(await (await gateway.upload(key, jsonl(f"clean-{order}-{i}"))).json())["id"] for i in range(5)}
    seen: list[str] = []
    after = ""
    while True:
        page = await gateway.client.get(f"/v1/files?limit=2&order={order}{after}", headers=key)
        assert page.status == 200, await page.text()
        listed = await page.json()
        for file in listed["data"]:
            seen.append(file["id"])
            assert (await gateway.client.delete(f"/v1/files/{file['id']}", headers=key)).status == 200
        if not listed["has_more"]:
            break
        after = f"&after={listed['last_id']}"

    assert sorted(seen) == sorted(uploaded)
    assert (await (await gateway.client.get("/v1/files", headers=key)).json())["data"] == []
    other = await gateway.client.get(f"/v1/files?after={seen[0]}", headers=await gateway.new_key())
    assert other.status == 400, "another owner's file is no cursor"


@pytest.mark.parametrize("query", ["limit=0", "limit=10001", "limit=ten", "order=sideways", "purpose=nonsense"])
async def test_bad_list_parameters_are_400s(gateway: Gateway, query: str) -> None:
    key = await gateway.new_key()
    response = await gateway.client.get(f"/v1/files?{query}", headers=key)
    assert response.status == 400
    assert set((await response.json())["error"]) == {"message", "type", "param", "code"}


async def test_the_model_named_at_upload_is_kept_with_the_file_and_makes_another_file_than_the_same_bytes_without(
        gateway: Gateway) -> None:
    key = await gateway.new_key()
    content = jsonl("named-at-upload")
    plain = await (await gateway.upload(key, content)).json()
    named = await gateway.upload({**key, "x-litellm-model": "smollm2"}, content)
    assert named.status == 200 and (await named.json())["id"] != plain["id"]
    assert gateway.client.app is not None
    record = await gateway.client.app[DEPS].read_model.get_file((await named.json())["id"])
    assert record is not None and record.model == "smollm2"
    by_query = await gateway.client.post("/v1/files?model=" + "m" * 300, data=b"x",
                                         headers={**key, "Content-Type": "multipart/form-data; boundary=b"})
    assert by_query.status == 400
    assert (await by_query.json())["error"]["code"] == "invalid_model"


async def test_a_file_name_that_is_not_utf8_or_too_long_is_refused_before_anything_is_stored(gateway: Gateway) -> None:
    key = await gateway.new_key()
    form = {**key, "Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
    for name in (b"\xff\xfe.jsonl", b"n" * (MAX_FILENAME + 1)):
        refused = await gateway.client.post("/v1/files", data=multipart_upload(name, jsonl("named")), headers=form)
        assert refused.status == 400
        assert (await refused.json())["error"] | {"message": ""} == {
            "message": "", "type": "invalid_request_error", "param": "file", "code": "invalid_filename"}
    assert (await (await gateway.client.get("/v1/files", headers=key)).json())["data"] == []
    longest = "\u00e9" * MAX_FILENAME
    stored = await gateway.client.post("/v1/files", data=multipart_upload(longest.encode(), jsonl("named")),
                                       headers=form)
    assert stored.status == 200 and (await stored.json())["filename"] == longest


async def test_a_model_header_that_is_not_utf8_is_refused(gateway: Gateway) -> None:
    key = await gateway.new_key()
    body = multipart_upload(b"in.jsonl", jsonl("model-header"))
    answer = await raw_exchange(gateway, (
        f"POST /v1/files HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary={BOUNDARY}\r\n"
        f"Authorization: {key['Authorization']}\r\nContent-Length: {len(body)}\r\n").encode()
        + b"X-LiteLLM-Model: smollm2\xff\r\n\r\n" + body)
    assert answer.status == 400
    assert orjson.loads(answer.body)["error"]["code"] == "invalid_model"


async def test_a_model_name_in_a_line_longer_than_any_models_id_is_not_kept_with_the_upload(gateway: Gateway) -> None:
    key = await gateway.new_key()
    line = orjson.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                         "body": {"model": "m" * (MAX_MODEL_NAME + 1), "messages": []}})
    stored = await gateway.upload(key, line + b"\n")
    assert stored.status == 200
    assert gateway.client.app is not None
    record = await gateway.client.app[DEPS].read_model.get_file((await stored.json())["id"])
    assert record is not None and record.demand is not None
    assert (record.demand.lines, record.demand.model) == (1, None)
