"""A real gateway and ledger in this process, against the session's real NATS and S3, and a key per test."""

import asyncio
import hashlib
import json
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp.test_utils import TestClient, TestServer

from contracts.events.key import KeyCreated
from contracts.ids import hash_api_key
from services.gateway.app import create_app as create_gateway
from services.gateway.settings import GatewaySettings
from services.ledger.app import create_app as create_ledger
from services.ledger.settings import LedgerSettings
from services.runtime.bus import EventBus
from services.runtime.settings import ConnectionSettings

WAIT_S = 30


@dataclass
class Gateway:
    client: TestClient
    bus: EventBus

    async def new_key(self) -> dict[str, str]:
        """A fresh user key, so each test is its own tenant with its own quota and limits."""
        key = f"gk-{secrets.token_hex(16)}"
        digest = hash_api_key(key)
        await self.bus.publish(KeyCreated(aggregate_id=digest[:32], key_sha256=digest, role="user", label="test"))
        headers = {"Authorization": f"Bearer {key}"}
        for _ in range(200):
            if (await self.client.get("/v1/files", headers=headers)).status == 200:
                return headers
            await asyncio.sleep(0.05)
        raise TimeoutError("the ledger never folded the new key")

    async def upload(self, headers: dict[str, str], content: bytes, **fields: str) -> aiohttp.ClientResponse:
        form = aiohttp.FormData()
        form.add_field("purpose", fields.pop("purpose", "batch"))
        for name, value in fields.items():
            form.add_field(name, value)
        form.add_field("file", content, filename="in.jsonl", content_type="application/octet-stream")
        return await self.client.post("/v1/files", data=form, headers=headers)


def jsonl(*custom_ids: str) -> bytes:
    return b"".join(json.dumps({"custom_id": c, "method": "POST", "url": "/v1/chat/completions",
                                "body": {"model": "smollm2", "messages": [{"role": "user", "content": c}]}}
                               ).encode() + b"\n" for c in custom_ids)


def sha256(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


@asynccontextmanager
async def running_gateway(connection: ConnectionSettings, **overrides: Any) -> AsyncIterator[Gateway]:
    stop = asyncio.Event()
    ledger = create_ledger(LedgerSettings(connection=connection))
    task = asyncio.create_task(ledger.run(stop))
    settings = GatewaySettings(connection=connection, read_your_writes_s=WAIT_S, file_sweep_interval_s=0,
                               **overrides)
    client = TestClient(TestServer(create_gateway(settings)))
    bus = await EventBus.connect(connection.nats_url, "tests-gateway")
    try:
        await asyncio.wait_for(ledger.caught_up.wait(), WAIT_S)
        await client.start_server()
        yield Gateway(client, bus)
    finally:
        await client.close()
        await bus.close()
        stop.set()
        await asyncio.wait_for(task, WAIT_S)
