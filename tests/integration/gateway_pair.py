"""Several gateways on the session's one broker and object store, as a deployment runs them: one ledger, each
gateway its own app (in this process, or as its own process to be killed), and clients from an address of their own."""

import asyncio
import os
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from aiohttp.test_utils import TestClient

from contracts.events.key import KeyCreated, KeyRole
from contracts.ids import hash_api_key, new_api_key
from infra.embedded import free_port, wait_for_port
from services.gateway.app import create_app as create_gateway
from services.gateway.context import DEPS
from services.gateway.settings import GatewaySettings
from services.ledger.app import create_app as create_ledger
from services.ledger.settings import LedgerSettings
from services.runtime.nats.bus import EventBus
from services.runtime.process.settings import ConnectionSettings
from tests.integration.gateway_support import WAIT_S, Gateway, GatewayTestServer

Headers = dict[str, str]


@asynccontextmanager
async def running_gateways(connection: ConnectionSettings, count: int = 2, **overrides: Any,
                           ) -> AsyncIterator[list[Gateway]]:
    stop = asyncio.Event()
    ledger = create_ledger(LedgerSettings(connection=connection))
    task = asyncio.create_task(ledger.run(stop))
    settings = GatewaySettings(connection=connection, **{"read_your_writes_s": WAIT_S, "file_sweep_interval_s": 0,
                                                         **overrides})
    clients = [TestClient(GatewayTestServer(create_gateway(settings))) for _ in range(count)]
    bus = await EventBus.connect(connection.nats_url, "tests-gateways")
    try:
        await asyncio.wait_for(ledger.caught_up.wait(), WAIT_S)
        for client in clients:
            await client.start_server()
        yield [Gateway(client, bus) for client in clients]
    finally:
        for client in clients:
            await client.close()
        await bus.close()
        stop.set()
        await asyncio.wait_for(task, WAIT_S)


async def key_of_role(gateway: Gateway, role: KeyRole = "user", raw: str | None = None) -> Headers:
    """A key (of the generated shape unless `raw` says otherwise), waited for in the read model: polling the API
    with it would count failed authentications."""
    raw = raw or new_api_key(False)
    digest = hash_api_key(raw)
    await gateway.bus.publish(KeyCreated(aggregate_id=digest[:32], key_sha256=digest, role=role, label=role))
    read_model = gateway.client.app[DEPS].read_model
    assert await read_model.wait_for(lambda: read_model.get_api_key(digest), lambda r: True, WAIT_S) is not None
    return {"Authorization": f"Bearer {raw}"}


def own_address() -> str:
    """A loopback address of this test's own, so its failed authentications are nobody else's (and theirs not
    its): Linux answers all of 127.0.0.0/8."""
    return f"127.{secrets.randbelow(250) + 1}.{secrets.randbelow(250) + 1}.{secrets.randbelow(250) + 1}"


def client_from(address: str) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=(address, 0)))


def url_of(gateway: Gateway, path: str) -> str:
    return f"http://{gateway.client.server.host}:{gateway.client.server.port}{path}"


def gateway_process(connection: ConnectionSettings, **settings: str) -> tuple[subprocess.Popen[bytes], str]:
    """`python -m services.gateway` on a free port (its base URL), as `sheshnag` runs it; the caller kills it."""
    port = free_port()
    env = {**os.environ, "SHESHNAG_NATS_URL": connection.nats_url, "SHESHNAG_S3_ENDPOINT": connection.s3_endpoint,
           "SHESHNAG_S3_ACCESS_KEY": connection.s3_access_key, "SHESHNAG_S3_SECRET_KEY": connection.s3_secret_key,
           "SHESHNAG_S3_BUCKET": connection.s3_bucket, "SHESHNAG_LOG_LEVEL": "WARNING",
           "SHESHNAG_GATEWAY_PORT": str(port), "SHESHNAG_GATEWAY_FILE_SWEEP_INTERVAL_S": "0",
           **{f"SHESHNAG_GATEWAY_{name.upper()}": value for name, value in settings.items()}}
    process = subprocess.Popen([sys.executable, "-m", "services.gateway"], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    wait_for_port(port, process, WAIT_S, "gateway")
    return process, f"http://127.0.0.1:{port}"
