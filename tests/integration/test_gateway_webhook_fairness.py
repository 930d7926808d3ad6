"""One owner's dead endpoints never delay another owner's webhooks (issue 29, attack 2): with 20 endpoints that
accept a connection and never answer, and the events of 8 of its batches due to each, another owner's webhook still
arrives within seconds, at the gateway's default concurrency and timeouts. Delivery is fair: round-robin across
owners, at most a few attempts at once per owner and per endpoint."""

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from services.gateway.settings import GatewaySettings
from services.runtime.process.settings import ConnectionSettings
from tests.integration.gateway_support import Gateway, running_gateway
from tests.integration.test_gateway_webhooks import Receiver, cancelled, new_batch, publish, register, until, validated

UNDER_ATTACK_BOUND_S = 10.0
"""What must hold: the attacker holds at most `webhook_owner_concurrency` (4) of the 16 slots, so the other owner's
delivery starts at the next poll (1 s) once the intake has recorded the attacker's facts before it (a few hundred
bucket writes): about quiet latency plus a second or two. 10 s leaves room for a loaded 2-core CI runner, and is
still far below what the unfair FIFO gave (every slot held for the 15 s timeout, again and again: minutes)."""


@pytest.fixture(scope="module")
async def gateway(connection: ConnectionSettings) -> AsyncIterator[Gateway]:
    # The defaults (16 at once, 15 s timeout, polled every second), loopback allowed for the local receivers.
    async with running_gateway(connection, webhook_allowed_cidrs=["127.0.0.0/8"]) as running:
        yield running


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    found = Receiver()
    app = web.Application()
    app.router.add_post("/hook", found.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    found.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/hook"  # type: ignore[union-attr]
    yield found
    await runner.cleanup()


@pytest.fixture
async def hanging() -> AsyncIterator[tuple[str, list[asyncio.StreamWriter]]]:
    """A server that accepts every connection, reads, and never answers."""
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        while await reader.read(65536):
            pass

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/hook", held
    server.close()
    for writer in held:
        writer.close()


async def delivery_latency(gateway: Gateway, headers: dict[str, str], receiver: Receiver) -> float:
    """Seconds from a fact of the owner's new batch being stated to its webhook arriving."""
    batch_id = await new_batch(gateway, headers)
    stated = time.monotonic()
    await publish(gateway, validated(batch_id))
    await until(lambda: len(receiver.bodies_for(batch_id)) == 1, "the other owner's webhook", timeout_s=60)
    return time.monotonic() - stated


async def test_an_owners_hanging_endpoints_do_not_delay_another_owners_webhook(
        gateway: Gateway, receiver: Receiver, hanging: tuple[str, list[asyncio.StreamWriter]]) -> None:
    victim, attacker = await gateway.new_key(), await gateway.new_key()
    await register(gateway, victim, receiver.url, events=["batch.validated"])
    quiet = await delivery_latency(gateway, victim, receiver)

    hanging_url, held = hanging
    for n in range(GatewaySettings.model_fields["max_webhooks_per_owner"].default):
        await register(gateway, attacker, f"{hanging_url}?n={n}")
    for _ in range(8):
        batch_id = await new_batch(gateway, attacker)
        await publish(gateway, validated(batch_id))
        await publish(gateway, cancelled(batch_id))
    await until(lambda: len(held) >= 4, "the attacker's deliveries hanging")
    under_attack = await delivery_latency(gateway, victim, receiver)

    print(f"\nother owner's webhook: {quiet:.2f}s quiet, {under_attack:.2f}s under attack "
          f"({len(held)} connections held by the attacker's endpoints)")
    assert under_attack < UNDER_ATTACK_BOUND_S
    assert len(held) <= GatewaySettings.model_fields["webhook_owner_concurrency"].default
