"""A create racing its key's revocation: the batch is stated only while the key is not revoked (its publish is fenced
on the revocation), and a revocation lists the key's live batches only once the read model holds it, so a batch made
with a revoked key never runs on."""

import asyncio
from collections.abc import AsyncIterator

import pytest

from contracts.events.batch import BatchCreated
from contracts.events.envelope import Event
from contracts.ids import hash_api_key
from services.gateway.context import DEPS
from services.gateway.usecases.revocation import revoke
from services.runtime.nats.bus import Fence
from services.runtime.nats.readmodel import ReadModel
from services.runtime.process.settings import ConnectionSettings
from tests.integration.gateway_support import Gateway, jsonl, running_gateway


@pytest.fixture(scope="module")
async def gateway(connection: ConnectionSettings) -> AsyncIterator[Gateway]:
    async with running_gateway(connection) as running:
        yield running


def create_body(file_id: str) -> dict[str, object]:
    return {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}


async def test_a_create_whose_key_is_revoked_before_its_batch_is_stated_is_refused(gateway: Gateway) -> None:
    key = await gateway.new_key()
    digest = hash_api_key(key["Authorization"].removeprefix("Bearer "))
    file_id = (await (await gateway.upload(key, jsonl("a", "b"))).json())["id"]
    d = gateway.client.app[DEPS]
    publish = d.bus.publish
    at_create, go_on = asyncio.Event(), asyncio.Event()

    async def held_at_the_create(event: Event, fence: Fence | None = None) -> int:
        if isinstance(event, BatchCreated):
            at_create.set()
            await go_on.wait()
        return await publish(event, fence)

    d.bus.publish = held_at_the_create
    try:
        creating = asyncio.create_task(gateway.client.post("/v1/batches", json=create_body(file_id), headers=key))
        await asyncio.wait_for(at_create.wait(), 10)  # admitted: the create is on its way to the log
        _, stopped = await revoke(gateway.bus, await ReadModel.open(gateway.bus), digest, "admin")
        go_on.set()
        answered = await creating
    finally:
        d.bus.publish = publish

    assert stopped == []
    assert answered.status == 401, await answered.text()
    assert (await answered.json())["error"]["code"] == "invalid_api_key"
