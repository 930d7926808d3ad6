"""A worker key revoked while its executor is connected, against a real nats-server with the embedded config: the
callout's responder has the server close that connection within seconds (its admission had an hour left), and
the reconnect is refused. Only the key's fact is in the log: the read model (the ledger) still says it is live."""

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.aio.client import Client

from contracts.ids import hash_api_key
from contracts.readmodel import ApiKeyRecord
from services.gateway.usecases.revocation import revoke_key
from tests.integration.authorized_broker import AuthorizedBroker, admitting_broker
from tests.support import put_api_key

CLOSED_WITHIN_S = 3.0
"""A revoke to its connections closed (the JWT they were admitted with lasts an hour)."""


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[AuthorizedBroker]:
    async with admitting_broker(tmp_path, ttl_s=3600.0) as broker:
        yield broker


@dataclass
class Executor:
    """An executor's connection as the broker sees it, with what the server told it."""

    client: Client
    disconnects: int = 0
    errors: list[str] = field(default_factory=list)

    async def on_disconnect(self) -> None:
        self.disconnects += 1

    async def on_error(self, error: Exception) -> None:
        self.errors.append(str(error).lower())


async def worker_key(running: AuthorizedBroker) -> str:
    key = f"wk-{secrets.token_urlsafe(16)}"
    await put_api_key(running.read_model, hash_api_key(key), ApiKeyRecord(
        key_id=f"key_{secrets.token_hex(4)}", role="worker", label="a provider's", revoked=False))
    return key


async def connected(running: AuthorizedBroker, executor_id: str, key: str) -> Executor:
    """Connected as the executor, reconnecting as nats-py does (so a closed connection tries to come back)."""
    executor = Executor(Client())
    await executor.client.connect(running.url, user=executor_id, password=key, reconnect_time_wait=0.2,  # type: ignore[arg-type]
                                  max_reconnect_attempts=-1, disconnected_cb=executor.on_disconnect,
                                  error_cb=executor.on_error)
    return executor


async def revoke(running: AuthorizedBroker, key: str) -> None:
    """What the gateway's revoke stores: the fact alone (the read model is left as it was, as if the ledger lagged)."""
    assert await revoke_key(running.core, running.read_model, hash_api_key(key), None) == []


async def until(condition: object, within_s: float) -> float:
    started = time.monotonic()
    while not condition():  # type: ignore[operator]
        assert time.monotonic() - started < within_s, "not within the time allowed"
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def test_an_executor_whose_worker_key_is_revoked_is_disconnected_within_seconds_and_kept_out(
        running: AuthorizedBroker) -> None:
    key = await worker_key(running)
    executor = await connected(running, "victim-of-revoke", key)
    await executor.client.flush()

    await revoke(running, key)
    await until(lambda: executor.disconnects > 0, CLOSED_WITHIN_S)

    await until(lambda: any("authorization violation" in error for error in executor.errors), CLOSED_WITHIN_S)
    await asyncio.sleep(1.0)  # several reconnect attempts
    assert not executor.client.is_connected, "the revoked key was let back in"
    with pytest.raises(nats.errors.Error, match=r"(?i)authorization violation"):
        await nats.connect(running.url, user="victim-of-revoke", password=key, allow_reconnect=False)
    await executor.client.close()


async def test_revoking_one_worker_key_leaves_executors_on_other_keys_connected(running: AuthorizedBroker) -> None:
    revoked_key, kept_key = await worker_key(running), await worker_key(running)
    gone = await connected(running, "gone", revoked_key)
    stays = await connected(running, "stays", kept_key)

    await revoke(running, revoked_key)
    await until(lambda: gone.disconnects > 0, CLOSED_WITHIN_S)
    await asyncio.sleep(0.5)
    assert stays.disconnects == 0 and stays.client.is_connected
    await stays.client.flush()
    await gone.client.close()
    await stays.client.close()
