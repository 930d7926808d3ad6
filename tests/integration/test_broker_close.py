"""A service's stop never waits for ever on its broker connection: with the broker gone (its connection
reconnecting for ever), closing it gives up within its bound."""

import asyncio
import time

from infra.embedded import stop_process
from services.runtime.nats.bus import EventBus
from tests.conftest import RunningNats


async def test_closing_a_connection_whose_broker_is_gone_gives_up_within_its_bound(fresh_nats: RunningNats) -> None:
    broker = (await EventBus.connect(fresh_nats.url, "tests")).broker
    await broker.start()
    stop_process(fresh_nats.process)
    await asyncio.sleep(1)  # reconnecting now

    started = time.monotonic()
    await broker.close_within(3.0)

    assert time.monotonic() - started < 30.0  # it returns (bounded), where an unbounded close waits for ever

