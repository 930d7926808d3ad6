"""A revoke is immediate on every gateway: two gateways on the real broker, the ledger stopped before the revoke,
so the read model still calls the key live and only the log says otherwise."""

import asyncio
import secrets
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from aiohttp.test_utils import TestClient

from contracts.events.key import KeyCreated
from contracts.ids import hash_api_key
from services.gateway.app import create_app as create_gateway
from services.gateway.settings import GatewaySettings
from services.ledger.app import create_app as create_ledger
from services.ledger.settings import LedgerSettings
from services.runtime.nats.bus import EventBus
from services.runtime.nats.readmodel import ReadModel
from services.runtime.process.settings import ConnectionSettings
from tests.integration.gateway_support import WAIT_S, GatewayTestServer

Headers = dict[str, str]


def bearer(key: str) -> Headers:
    return {"Authorization": f"Bearer {key}"}


@asynccontextmanager
async def gateways(connection: ConnectionSettings, count: int) -> AsyncIterator[list[TestClient]]:
    async with AsyncExitStack() as stack:
        clients = [TestClient(GatewayTestServer(create_gateway(GatewaySettings(connection=connection,
                                                                               file_sweep_interval_s=0))))
                   for _ in range(count)]
        for client in clients:
            await client.start_server()
            stack.push_async_callback(client.close)
        yield clients


@asynccontextmanager
async def ledger(connection: ConnectionSettings) -> AsyncIterator[None]:
    """The ledger folds while inside; on leaving it stops, and the read model stands still."""
    stop = asyncio.Event()
    running = create_ledger(LedgerSettings(connection=connection))
    task = asyncio.create_task(running.run(stop))
    try:
        await asyncio.wait_for(running.caught_up.wait(), WAIT_S)
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, WAIT_S)


async def admin_key(connection: ConnectionSettings) -> Headers:
    raw = f"gk-{secrets.token_hex(16)}"
    digest = hash_api_key(raw)
    bus = await EventBus.connect(connection.nats_url, "tests-revocation")
    try:
        await bus.publish(KeyCreated(aggregate_id=digest[:32], key_sha256=digest, role="admin", label="admin"))
        read_model = await ReadModel.open(bus)
        assert await read_model.wait_for(lambda: read_model.get_api_key(digest), lambda r: True, WAIT_S)
    finally:
        await bus.close()
    return bearer(raw)


async def new_key(client: TestClient, admin: Headers, path: str, **body: str) -> tuple[str, Headers]:
    made = await client.post(path, json=body, headers=admin)
    assert made.status == 200, await made.text()
    key = await made.json()
    return key["id"], bearer(key["value"])


async def test_a_revoked_key_is_refused_by_every_gateway_the_moment_the_revoke_returns_with_the_ledger_stopped(
        connection: ConnectionSettings) -> None:
    async with gateways(connection, 2) as (first, second):
        async with ledger(connection):
            admin = await admin_key(connection)
            user_id = f"u-{secrets.token_hex(4)}"
            assert (await first.post("/v1/organization/users", json={"id": user_id}, headers=admin)).status == 200
            key_id, key = await new_key(first, admin, "/v1/organization/keys", user_id=user_id)
            for client in (first, second):  # both now hold the key as live in their caches
                assert (await client.get("/v1/files", headers=key)).status == 200
        revoked = await first.delete(f"/v1/organization/keys/{key_id}", headers=admin)
        assert revoked.status == 200, await revoked.text()
        for client in (second, first):
            refused = await client.get("/v1/files", headers=key)
            assert refused.status == 401
            assert "revoked" in (await refused.json())["error"]["message"]


async def test_a_revoked_worker_key_is_refused_by_every_gateway_the_moment_the_revoke_returns(
        connection: ConnectionSettings) -> None:
    async with gateways(connection, 2) as (first, second):
        async with ledger(connection):
            admin = await admin_key(connection)
            key_id, key = await new_key(first, admin, "/v1/provider/worker_keys", name="fleet")
            probe = await second.get("/v1/files", headers=key)
            assert probe.status == 401 and "Worker keys" in (await probe.json())["error"]["message"]
        assert (await first.delete(f"/v1/provider/worker_keys/{key_id}", headers=admin)).status == 200
        refused = await second.get("/v1/files", headers=key)
        assert "revoked" in (await refused.json())["error"]["message"]


async def test_a_live_key_keeps_working_with_the_ledger_stopped(connection: ConnectionSettings) -> None:
    """The log check refuses only keys whose revocation is stored: a stalled ledger locks nobody out."""
    async with gateways(connection, 1) as (gateway,):
        async with ledger(connection):
            admin = await admin_key(connection)
            user_id = f"u-{secrets.token_hex(4)}"
            assert (await gateway.post("/v1/organization/users", json={"id": user_id}, headers=admin)).status == 200
            _, key = await new_key(gateway, admin, "/v1/organization/keys", user_id=user_id)
        for _ in range(3):
            assert (await gateway.get("/v1/files", headers=key)).status == 200
