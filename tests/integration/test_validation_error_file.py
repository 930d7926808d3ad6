"""A batch that failed validation, through the real gateway, ledger and validator: its counts agree with its
error file, which its owner downloads and nobody else sees."""

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from services.runtime.process.settings import ConnectionSettings
from services.validator.app import run_validator
from services.validator.settings import ValidatorSettings
from tests.integration.gateway_support import WAIT_S, Gateway, jsonl, running_gateway


@pytest.fixture(scope="module")
async def gateway(connection: ConnectionSettings) -> AsyncIterator[Gateway]:
    stop = asyncio.Event()
    validator = asyncio.create_task(run_validator(ValidatorSettings(connection=connection, count_tokens=False),
                                                  stop))
    async with running_gateway(connection, control_call_burst=1000) as running:
        yield running
    stop.set()
    await asyncio.wait_for(validator, WAIT_S)


async def failed_batch(gateway: Gateway, key: dict[str, str], content: bytes) -> dict[str, Any]:
    file_id = (await (await gateway.upload(key, content)).json())["id"]
    created = await gateway.client.post("/v1/batches", headers=key, json={
        "input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"})
    assert created.status == 200
    batch_id = (await created.json())["id"]
    for _ in range(WAIT_S * 20):
        batch: dict[str, Any] = await (await gateway.client.get(f"/v1/batches/{batch_id}", headers=key)).json()
        if batch["status"] != "validating":
            return batch
        await asyncio.sleep(0.05)
    raise AssertionError("the batch was never validated")


async def test_a_failed_batch_accounts_for_every_line_in_an_error_file_only_its_owner_downloads(
        gateway: Gateway) -> None:
    owner, stranger = await gateway.new_key(), await gateway.new_key()
    content = jsonl("good-1") + b"{oops\n" + jsonl("good-2").replace(b'"POST"', b'"GET"')
    batch = await failed_batch(gateway, owner, content)
    assert batch["status"] == "failed" and batch["status_reason"] == "2 of 3 input lines failed validation."
    assert batch["request_counts"] == {"total": 3, "completed": 0, "failed": 3}
    assert batch["errors"]["total"] == 2 and batch["output_file_id"] is None

    download = await gateway.client.get(f"/v1/files/{batch['error_file_id']}/content", headers=owner)
    assert download.status == 200
    lines = [json.loads(raw) for raw in (await download.read()).splitlines()]
    assert [(line["custom_id"], line["error"]["code"]) for line in lines] == [
        ("good-1", "batch_failed_validation"), (None, "invalid_json"), ("good-2", "invalid_method")]
    not_run, *refused = lines
    assert set(not_run) == {"id", "custom_id", "response", "error"} and not_run["response"] is None
    assert [(line["line"], line["response"]["status_code"], line["response"]["body"]["error"]["code"])
            for line in refused] == [(2, 400, "invalid_json"), (3, 400, "invalid_method")]
    listed = await (await gateway.client.get(f"/v1/files/{batch['error_file_id']}", headers=owner)).json()
    assert listed["purpose"] == "batch_output"

    assert (await gateway.client.get(f"/v1/files/{batch['error_file_id']}/content", headers=stranger)).status == 404
