"""Attack: keep an executor connected to the broker after its worker key is revoked, riding on the hour its
admission was granted for. The broker must close the connection within seconds of the revoke, and refuse it
back, even with the ledger (the read model the callout reads keys from) stopped."""

import asyncio
import secrets
import time
from collections.abc import Callable

import httpx2
import nats
import nats.errors
import pytest
from nats.aio.client import Client

from tests.security.conftest import ADMIN_KEY, RunningStack
from tests.security.test_revocation import paused

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
CLOSED_WITHIN_S = 5.0
ADMITTED_WITHIN_S = 60.0
"""A new worker key is admitted once the ledger has folded it."""


def provider_worker_key(stack: RunningStack) -> tuple[str, str, str]:
    """A provider registered by the admin and a worker key made under it: (its worker-keys path, key id, key)."""
    with httpx2.Client(base_url=stack.base_url, headers=ADMIN, timeout=30) as http:
        provider = http.post("/provider/providers", json={"name": f"rack-{secrets.token_hex(3)}"})
        assert provider.status_code == 200, provider.text
        keys_path = f"/provider/providers/{provider.json()['id']}/worker_keys"
        key = http.post(keys_path, json={"name": "rack 1"})
        assert key.status_code == 200, key.text
        return keys_path, key.json()["id"], key.json()["value"]


async def within(seconds: float, condition: Callable[[], bool]) -> float:
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < seconds, f"not within {seconds}s"
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def connect_as_executor(stack: RunningStack, executor_id: str, key: str, on_disconnect: Callable[[], None],
                              errors: list[str]) -> Client:
    """Connected the way an executor connects, reconnecting on its own as nats-py does."""
    async def disconnected() -> None:
        on_disconnect()

    async def error(problem: Exception) -> None:
        errors.append(str(problem).lower())

    deadline = time.monotonic() + ADMITTED_WITHIN_S
    while True:
        client = Client()
        try:
            await client.connect(stack.nats_url(), user=executor_id, password=key, max_reconnect_attempts=-1,
                                 reconnect_time_wait=0.2, disconnected_cb=disconnected,  # type: ignore[arg-type]
                                 error_cb=error, connect_timeout=5)
            return client
        except nats.errors.Error:
            await client.close()
            assert time.monotonic() < deadline, "the new worker key was never admitted"
            await asyncio.sleep(0.5)


async def test_an_executor_is_disconnected_within_seconds_of_its_worker_key_revoke_and_kept_out(
        secure_stack: RunningStack) -> None:
    keys_path, key_id, key = provider_worker_key(secure_stack)
    executor_id = f"rogue-{secrets.token_hex(3)}"
    disconnects: list[float] = []
    errors: list[str] = []
    client = await connect_as_executor(secure_stack, executor_id, key, lambda: disconnects.append(time.monotonic()),
                                       errors)
    await client.flush()
    errors.clear()

    with paused(secure_stack, "ledger"):
        revoked = await asyncio.to_thread(httpx2.delete, f"{secure_stack.base_url}{keys_path}/{key_id}",
                                          headers=ADMIN, timeout=30)
        assert revoked.status_code == 200, revoked.text
        revoked_at = time.monotonic()
        await within(CLOSED_WITHIN_S, lambda: bool(disconnects))
        await within(CLOSED_WITHIN_S, lambda: any("authorization violation" in e for e in errors))
        await asyncio.sleep(1.0)  # its reconnects meanwhile
        assert not client.is_connected, "the revoked worker key got back in"
        with pytest.raises(nats.errors.Error, match=r"(?i)authorization violation"):
            await nats.connect(secure_stack.nats_url(executor_id, key), allow_reconnect=False, connect_timeout=5)
    assert disconnects[0] - revoked_at < CLOSED_WITHIN_S
    await client.close()
