"""Liveness and readiness told apart, against a real gateway on its own broker: `/readyz` answers 503 while the
broker or the object store is unreachable and 200 once both answer; `/healthz` stays 200 throughout."""

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient

from infra.embedded import free_port, start_nats, stop_process
from services.gateway.app import create_app
from services.gateway.http.readiness import READINESS, Readiness
from services.gateway.settings import GatewaySettings
from services.runtime.process.settings import ConnectionSettings
from tests.conftest import RunningNats
from tests.integration.gateway_support import GatewayTestServer


@asynccontextmanager
async def gateway_alone(connection: ConnectionSettings) -> AsyncIterator[TestClient[Any, Any]]:
    """The gateway alone (no ledger: readiness reads nothing it folds)."""
    client: TestClient[Any, Any] = TestClient(GatewayTestServer(create_app(GatewaySettings(
        connection=connection, file_sweep_interval_s=0))))
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()


async def probe(gateway: TestClient[Any, Any]) -> tuple[int, Any, int]:
    ready = await gateway.get("/readyz")
    alive = await gateway.get("/healthz")
    return ready.status, await ready.json(), alive.status


async def until_ready(gateway: TestClient[Any, Any], tries: int = 75) -> tuple[int, Any, int]:
    for _ in range(tries):  # the gateway's connection comes back within moments of the broker
        answer = await probe(gateway)
        if answer[0] == 200:
            break
        await asyncio.sleep(0.2)
    return answer


async def test_readyz_says_which_of_broker_and_object_store_is_unreachable_while_healthz_stays_200(
        tmp_path: Path, fresh_nats: RunningNats, connection: ConnectionSettings) -> None:
    own = connection.model_copy(update={"nats_url": fresh_nats.url})
    port = int(fresh_nats.url.rsplit(":", 1)[1])
    restarted = None
    try:
        async with gateway_alone(own) as gateway:
            assert await probe(gateway) == (200, {"status": "ready", "checks": {"nats": "ok", "s3": "ok"}}, 200)

            readiness = gateway.app[READINESS]
            reachable, unreachable = readiness.s3, own.model_copy(update={"s3_endpoint": f"127.0.0.1:{free_port()}"})
            readiness.s3 = Readiness.from_settings(unreachable).s3
            assert await probe(gateway) == (503, {"status": "unavailable", "checks": {"nats": "ok", "s3": "error"}},
                                             200)
            readiness.s3 = reachable

            stop_process(fresh_nats.process)
            status, body, alive = await probe(gateway)
            assert (status, body["checks"]["nats"], body["checks"]["s3"], alive) == (503, "disconnected", "ok", 200)

            restarted = start_nats(tmp_path, port, tmp_path / "nats-again.log")
            assert await until_ready(gateway) == (200, {"status": "ready", "checks": {"nats": "ok", "s3": "ok"}},
                                                  200)
    finally:
        if restarted is not None:
            stop_process(restarted)


async def test_a_key_the_gateway_cannot_check_while_the_broker_is_down_is_refused_with_a_clear_503(
        fresh_nats: RunningNats, connection: ConnectionSettings) -> None:
    """The key's record and its revocation are read from the broker: unread, the request is refused (never admitted
    unchecked) with a 503 the client retries, in OpenAI's shape, not a 500."""
    async with gateway_alone(connection.model_copy(update={"nats_url": fresh_nats.url})) as gateway:
        stop_process(fresh_nats.process)
        answer = await gateway.get("/v1/batches", headers={"Authorization": "Bearer gk-a-key-it-cannot-look-up"})
        error = (await answer.json())["error"]
        assert (answer.status, error["code"], error["type"]) == (503, "broker_unavailable", "server_error"), error
        assert set(error) == {"message", "type", "param", "code"} and answer.headers["Retry-After"] == "1"
