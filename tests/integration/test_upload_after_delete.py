"""The same bytes uploaded again after their file was deleted are a new file, even while the ledger lags and the read
model still shows the deleted one (its bytes are gone: answering with it lost the upload); and a batch on a file
stored but not folded yet is a 503 to retry, never a 404."""

import asyncio
import secrets
import time

import aiohttp
from aiohttp.test_utils import TestClient

from services.gateway.app import create_app as create_gateway
from services.gateway.settings import GatewaySettings
from services.runtime.process.settings import ConnectionSettings
from tests.integration.gateway_support import WAIT_S, GatewayTestServer, jsonl
from tests.integration.test_gateway_revocation import admin_key, ledger, new_key


async def upload(client: TestClient, headers: dict[str, str], content: bytes) -> str:
    form = aiohttp.FormData()
    form.add_field("purpose", "batch")
    form.add_field("file", content, filename="in.jsonl", content_type="application/octet-stream")
    answer = await client.post("/v1/files", data=form, headers=headers)
    assert answer.status == 200, await answer.text()
    return str((await answer.json())["id"])


async def test_bytes_uploaded_again_after_their_file_was_deleted_are_a_new_file_while_the_ledger_lags(
        connection: ConnectionSettings) -> None:
    client = TestClient(GatewayTestServer(create_gateway(GatewaySettings(
        connection=connection, file_sweep_interval_s=0, read_your_writes_s=0.5, own_writes_wait_s=0.5))))
    await client.start_server()
    try:
        content = jsonl("again-a", "again-b")
        async with ledger(connection):
            admin = await admin_key(connection)
            user_id = f"u-{secrets.token_hex(4)}"
            assert (await client.post("/v1/organization/users", json={"id": user_id}, headers=admin)).status == 200
            _, key = await new_key(client, admin, "/v1/organization/keys", user_id=user_id)
            first = await upload(client, key, content)
        # The ledger stopped: the delete is in the log, the read model still shows the file.
        assert (await client.delete(f"/v1/files/{first}", headers=key)).status == 200
        second = await upload(client, key, content)

        assert second != first
        # Stored, and not folded yet: a batch on it is asked to come back shortly, never told the file does not exist.
        early = await client.post("/v1/batches", headers=key, json={
            "input_file_id": second, "endpoint": "/v1/chat/completions", "completion_window": "24h"})
        assert early.status == 503 and "Retry-After" in early.headers, await early.text()
        assert (await early.json())["error"]["code"] == "ledger_behind"
        async with ledger(connection):
            deadline = time.monotonic() + WAIT_S
            while (answer := await client.get(f"/v1/files/{second}/content", headers=key)).status in (404, 503):
                assert time.monotonic() < deadline, "the new file never showed"
                await asyncio.sleep(0.1)
            assert answer.status == 200 and await answer.read() == content
    finally:
        await client.close()
