"""A gateway stopped while a webhook attempt is under way hands the delivery to the next gateway at once, under the
same id. In a module of its own: no other gateway on the broker may take the delivery first."""

import asyncio
from collections.abc import AsyncIterator

import pytest

from services.gateway.webhooks.deliverer import CLAIM_MARGIN_S
from services.runtime.process.settings import ConnectionSettings
from tests.integration.gateway_support import running_gateway
from tests.integration.test_gateway_webhooks import (
    FAST,
    WAIT_S,
    Receiver,
    new_batch,
    publish,
    register,
    serving_receiver,
    until,
    validated,
)


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    async with serving_receiver() as found:
        yield found


async def test_a_gateway_stopped_mid_attempt_hands_the_delivery_to_the_next_gateway_at_once(
        connection: ConnectionSettings, receiver: Receiver) -> None:
    """Its claim is not left leased for the attempt's timeout and margin (longer than this test waits), and the
    delivery keeps its id."""
    assert WAIT_S < CLAIM_MARGIN_S
    receiver.stall = asyncio.Event()
    try:
        async with running_gateway(connection, **FAST) as first:
            alice = await first.new_key()
            await register(first, alice, receiver.url)
            batch = await new_batch(first, alice)
            await publish(first, validated(batch))
            await until(lambda: len(receiver.bodies_for(batch)) == 1, "the attempt under way")
        receiver.stall.set()
        async with running_gateway(connection, **FAST):
            await until(lambda: len(receiver.bodies_for(batch)) >= 2, "the next gateway's attempt")
        assert len({headers["webhook-id"] for headers, _ in receiver.bodies_for(batch)}) == 1
    finally:
        receiver.stall.set()
