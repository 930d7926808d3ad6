"""One tenant's input file cannot stop the ledger for everyone: lines whose refusals would quote 20 kB values each
(a `url` of 20,000 characters) are rejected with clipped messages, the batch's record stays far below what the
broker takes, its validation ends as usual, and the next tenant's key is folded and usable as always."""

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from contracts.events.batch import ISSUE_MESSAGE_CHARS
from services.runtime.process.settings import ConnectionSettings
from services.validator.app import run_validator
from services.validator.settings import ValidatorSettings
from tests.integration.gateway_support import Gateway, running_gateway

LINES = 100
URL_CHARS = 20_000


def file_of_long_urls() -> bytes:
    return b"".join(json.dumps({"custom_id": f"c{number}", "method": "POST", "url": "/v1/" + "x" * URL_CHARS,
                                "body": {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}}
                               ).encode() + b"\n" for number in range(LINES))


@pytest.fixture
async def gateway_and_validator(connection: ConnectionSettings) -> AsyncIterator[Gateway]:
    stop = asyncio.Event()
    validator = asyncio.create_task(run_validator(ValidatorSettings(connection=connection), stop))
    try:
        async with running_gateway(connection) as gateway:
            yield gateway
    finally:
        stop.set()
        await asyncio.wait_for(validator, 30)


async def test_long_values_in_refused_lines_neither_bloat_the_batch_nor_stop_the_ledger(
        gateway_and_validator: Gateway) -> None:
    gateway = gateway_and_validator
    attacker = await gateway.new_key()
    uploaded = await gateway.upload(attacker, file_of_long_urls())
    assert uploaded.status == 200, await uploaded.text()
    created = await gateway.client.post("/v1/batches", headers=attacker, json={
        "input_file_id": (await uploaded.json())["id"], "endpoint": "/v1/chat/completions",
        "completion_window": "24h"})
    assert created.status == 200, await created.text()
    batch_id = (await created.json())["id"]

    for _ in range(600):
        batch = await (await gateway.client.get(f"/v1/batches/{batch_id}", headers=attacker)).json()
        if batch["status"] == "failed":
            break
        await asyncio.sleep(0.1)
    assert batch["status"] == "failed", batch["status"]
    errors = batch["errors"]["data"]
    assert [error["code"] for error in errors] == ["url_mismatch"] * LINES
    assert max(len(error["message"]) for error in errors) <= ISSUE_MESSAGE_CHARS

    someone_else = await gateway.new_key()  # folded by the ledger, as every fact after the attacker's is
    listed = await gateway.client.get("/v1/batches", headers=someone_else)
    assert listed.status == 200, await listed.text()
