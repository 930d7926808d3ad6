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
from aiohttp.web_runner import BaseRunner

from contracts.events.key import KeyCreated
from contracts.ids import hash_api_key
from contracts.subjects import READ_MODEL_BUCKET
from services.gateway.app import create_app as create_gateway
from services.gateway.http.server import GatewayRunner
from services.gateway.settings import GatewaySettings
from services.ledger.app import create_app as create_ledger
from services.ledger.settings import LedgerSettings
from services.runtime.nats.bus import EventBus
from services.runtime.nats.readmodel import ReadModel
from services.runtime.process.settings import ConnectionSettings

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
        read_model = await ReadModel.open(self.bus)
        # Polled in the read model, not with the key itself: every 401 would count as a failed guess towards the
        # brute-force limit all gateways on the broker share.
        for _ in range(400):
            if await read_model.get_api_key(digest) is not None:
                return {"Authorization": f"Bearer {key}"}
            await asyncio.sleep(0.025)
        raise TimeoutError("the ledger never folded the new key")

    async def upload(self, headers: dict[str, str], content: bytes, filename: str = "in.jsonl", **fields: str,
                     ) -> aiohttp.ClientResponse:
        form = aiohttp.FormData()
        form.add_field("purpose", fields.pop("purpose", "batch"))
        for name, value in fields.items():
            form.add_field(name, value)
        form.add_field("file", content, filename=filename, content_type="application/octet-stream")
        return await self.client.post("/v1/files", data=form, headers=headers)


def jsonl(*custom_ids: str) -> bytes:
    return b"".join(json.dumps({"custom_id": c, "method": "POST", "url": "/v1/chat/completions",
                                "body": {"model": "smollm2", "messages": [{"role": "user", "content": c}]}}
                               ).encode() + b"\n" for c in custom_ids)


def sha256(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


class GatewayTestServer(TestServer):
    """Served as `sheshnag gateway` serves it: its runner's protocol, and no handler cancellation on disconnect."""

    async def _make_runner(self, **kwargs: Any) -> BaseRunner:
        kwargs.pop("handler_cancellation", None)
        return GatewayRunner(self.app, **kwargs)


@asynccontextmanager
async def running_gateway(connection: ConnectionSettings, **overrides: Any) -> AsyncIterator[Gateway]:
    stop = asyncio.Event()
    ledger = create_ledger(LedgerSettings(connection=connection))
    task = asyncio.create_task(ledger.run(stop))
    settings = GatewaySettings(connection=connection, **{"read_your_writes_s": WAIT_S, "file_sweep_interval_s": 0,
                                                         **overrides})
    client = TestClient(GatewayTestServer(create_gateway(settings)))
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


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    """Lower-cased names."""
    body: bytes


async def raw_exchange(gateway: Gateway, request: bytes, timeout_s: float = 10.0, *later: bytes,
                       pause_s: float = 0.3) -> RawResponse:
    """Send bytes no HTTP client would (bad request lines, non-UTF-8 headers), and each of `later` after a pause (as
    a slow network's segments arrive); read the answer to the end."""
    server = gateway.client.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        for part in (request, *later):
            if part is not request:
                await asyncio.sleep(pause_s)
            writer.write(part)
            await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout_s)
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        headers = {name.strip().lower(): value.strip()
                   for name, _, value in (line.partition(":") for line in header_lines if line)}
        length = int(headers.get("content-length", "0"))
        body = await asyncio.wait_for(reader.readexactly(length), timeout_s)
        return RawResponse(int(status_line.split()[1]), headers, body)
    finally:
        writer.close()


EVERY = (b".apikey.>", b".provider.>", b".executor.>")
"""The listings of every key, provider and executor record."""


async def key_listings_during(gateway: Gateway, steps: Any, every: tuple[bytes, ...] = EVERY) -> list[bytes]:
    """The reads that list every API key, provider or executor (or what `every` names) made while `steps` run."""
    listings: list[bytes] = []

    async def seen(message: Any) -> None:
        if b"next_by_subj" in message.data and any(kind in message.data for kind in every):
            listings.append(message.data)
    stream = f"KV_{READ_MODEL_BUCKET}"
    subscriptions = [await gateway.bus.nc.subscribe(subject, cb=seen)
                     for subject in (f"$JS.API.DIRECT.GET.{stream}", f"$JS.API.DIRECT.GET.{stream}.>")]
    try:
        await steps()
    finally:
        for subscription in subscriptions:
            await subscription.unsubscribe()
    return listings
