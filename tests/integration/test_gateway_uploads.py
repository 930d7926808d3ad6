"""Uploads and downloads under load and failure, against a real broker, ledger and SeaweedFS: many at once never
wedge the gateway, a stalled client and a dead object store end with clean errors, excess waits or gets 503, and a
gateway killed mid-upload loses nothing it acknowledged: another gateway lists and serves it all."""

import asyncio
import hashlib
from collections.abc import Iterator
from pathlib import Path
from subprocess import Popen

import aiohttp
import pytest

from infra.embedded import S3Credentials, free_port, start_seaweed, stop_process
from services.runtime.process.settings import ConnectionSettings
from services.runtime.storage.objectstore import UPLOAD_PART_BYTES
from tests.integration.gateway_pair import gateway_process, running_gateways
from tests.integration.gateway_support import Gateway, RawResponse, jsonl, raw_exchange, running_gateway


def big_jsonl(megabytes: float, tag: str) -> bytes:
    line = jsonl(tag)
    return line * int(megabytes * 1024 * 1024 // len(line) + 1)


def multipart_head(boundary: str, declared_bytes: int) -> bytes:
    return (f"POST /v1/files HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary={boundary}\r\n"
            f"Content-Length: {declared_bytes}\r\n").encode()


async def stalled_upload(gateway: Gateway, key: dict[str, str]) -> asyncio.Task[RawResponse]:
    """An upload that declares a body of 1 MB, sends 200 bytes of its file, then goes quiet (still connected)."""
    boundary = "stall"
    start = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--{boundary}\r\n"
             "Content-Disposition: form-data; name=\"file\"; filename=\"x.jsonl\"\r\n"
             "Content-Type: application/octet-stream\r\n\r\n").encode() + jsonl("stalled")[:200]
    request = multipart_head(boundary, 1024 * 1024) + f"Authorization: {key['Authorization']}\r\n\r\n".encode()
    return asyncio.create_task(raw_exchange(gateway, request + start, timeout_s=60))


async def test_many_large_uploads_at_once_all_land_and_the_gateway_still_serves_files(
        connection: ConnectionSettings) -> None:
    async with running_gateway(connection, upload_slots=8) as gateway:
        key = await gateway.new_key()
        bodies = [big_jsonl(UPLOAD_PART_BYTES / 2**20 + 1, f"many-{i}") for i in range(12)]

        answers = await asyncio.gather(*(gateway.upload(key, body) for body in bodies))

        assert [a.status for a in answers] == [200] * 12
        for answer, body in zip(answers, bodies, strict=True):
            file = await answer.json()
            content = await gateway.client.get(f"/v1/files/{file['id']}/content", headers=key)
            assert hashlib.sha256(await content.read()).hexdigest() == hashlib.sha256(body).hexdigest()
        assert (await gateway.upload(key, jsonl("after"))).status == 200


async def test_a_client_that_sends_less_than_its_content_length_gets_a_408_and_nothing_is_kept(
        connection: ConnectionSettings) -> None:
    async with running_gateway(connection, client_idle_timeout_s=1.0) as gateway:
        key = await gateway.new_key()

        answer = await (await stalled_upload(gateway, key))

        assert answer.status == 408
        assert b'"request_timeout"' in answer.body
        listed = await (await gateway.client.get("/v1/files", headers=key)).json()
        assert listed["data"] == []


async def test_uploads_past_the_gateways_slots_wait_then_get_503_with_retry_after(
        connection: ConnectionSettings) -> None:
    async with running_gateway(connection, upload_slots=1, transfer_slot_wait_s=0.5,
                               client_idle_timeout_s=3.0) as gateway:
        key = await gateway.new_key()
        stalled = await stalled_upload(gateway, key)
        await asyncio.sleep(0.5)  # the stalled upload holds the only slot

        busy = await gateway.upload(key, jsonl("busy"))

        assert busy.status == 503 and busy.headers["Retry-After"]
        assert (await busy.json())["error"]["code"] == "server_busy"
        assert (await stalled).status == 408
        assert (await gateway.upload(key, jsonl("later"))).status == 200


@pytest.fixture
def own_s3(tmp_path: Path, connection: ConnectionSettings) -> Iterator[tuple[ConnectionSettings, Popen[bytes]]]:
    creds = S3Credentials.load_or_create(tmp_path / "s3-credentials.json")
    port = free_port()
    (tmp_path / "s3").mkdir()
    process = start_seaweed(tmp_path, port, creds, tmp_path / "weed.log")
    settings = connection.model_copy(update={"s3_endpoint": f"127.0.0.1:{port}", "s3_access_key": creds.access_key,
                                             "s3_secret_key": creds.secret_key, "s3_bucket": "dying"})
    yield settings, process
    stop_process(process)


async def test_an_object_store_killed_mid_upload_gives_a_clean_503_and_the_gateway_goes_on(
        own_s3: tuple[ConnectionSettings, Popen[bytes]]) -> None:
    settings, process = own_s3
    async with running_gateway(settings, object_store_timeout_s=20.0) as gateway:
        key = await gateway.new_key()
        body = big_jsonl(40, "dies")
        upload = asyncio.create_task(gateway.upload(key, body))
        await asyncio.sleep(0.15)
        process.kill()

        answer = await asyncio.wait_for(upload, 90)

        assert answer.status == 503, await answer.text()
        assert (await answer.json())["error"]["code"] == "object_store_unavailable"
        assert answer.headers["Retry-After"]
        assert (await gateway.client.get("/v1/files", headers=key)).status == 200


async def test_a_download_the_client_abandons_frees_its_slot(connection: ConnectionSettings) -> None:
    async with running_gateway(connection, download_slots=1, transfer_slot_wait_s=5.0) as gateway:
        key = await gateway.new_key()
        file = await (await gateway.upload(key, big_jsonl(4, "download"))).json()
        server = gateway.client.server
        for _ in range(3):
            async with aiohttp.ClientSession() as session:
                response = await session.get(f"http://{server.host}:{server.port}/v1/files/{file['id']}/content",
                                             headers=key)
                await response.content.read(1024)
                response.close()  # gone mid-body
        whole = await gateway.client.get(f"/v1/files/{file['id']}/content", headers=key)
        assert whole.status == 200 and len(await whole.read()) == file["bytes"]


async def test_a_gateway_killed_mid_upload_loses_no_upload_it_acknowledged_and_another_serves_them(
        connection: ConnectionSettings) -> None:
    async with running_gateways(connection, count=1) as (survivor,):
        process, base = gateway_process(connection)
        try:
            key = await survivor.new_key()
            bodies = [big_jsonl(0.2, f"kept-{n}") for n in range(3)]
            acknowledged = []
            async with aiohttp.ClientSession() as http:
                for body in bodies:
                    form = aiohttp.FormData({"purpose": "batch"})
                    form.add_field("file", body, filename="kept.jsonl", content_type="application/octet-stream")
                    async with http.post(f"{base}/v1/files", data=form, headers=key) as answer:
                        assert answer.status == 200, await answer.text()
                        acknowledged.append(((await answer.json())["id"], body))
            port = int(base.rsplit(":", 1)[1])
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            boundary = "dying"
            writer.write(multipart_head(boundary, 8 * 1024 * 1024) + f"Authorization: {key['Authorization']}\r\n\r\n"
                         f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
                         f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"dying.jsonl\"\r\n"
                         "Content-Type: application/octet-stream\r\n\r\n".encode() + big_jsonl(1, "dying"))
            await writer.drain()
            await asyncio.sleep(0.3)  # the gateway is streaming it to the object store

            process.kill()

            try:
                rest = await asyncio.wait_for(reader.read(), 10)
            except ConnectionResetError:  # the body it had not read yet makes the kernel reset the connection
                rest = b""
            assert rest == b"", "the connection ends with no answer"
            writer.close()
        finally:
            process.kill()
            process.wait()
        listed = await (await survivor.client.get("/v1/files", headers=key)).json()
        assert sorted(f["id"] for f in listed["data"]) == sorted(file_id for file_id, _ in acknowledged)
        for file_id, body in acknowledged:
            content = await survivor.client.get(f"/v1/files/{file_id}/content", headers=key)
            assert hashlib.sha256(await content.read()).hexdigest() == hashlib.sha256(body).hexdigest()
