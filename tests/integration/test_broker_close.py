"""A service's stop never waits for ever on its broker connection: with the broker gone (its connection
reconnecting for ever), closing it gives up within its bound."""

import asyncio
import threading
import time

from pydantic import BaseModel

from contracts.subjects import WORK_STREAM
from infra.embedded import stop_process
from services.runtime.nats.bus import ConsumerPolicy, EventBus
from services.runtime.nats.delivery import Durable, ServiceRouter
from tests.conftest import RunningNats


async def test_closing_a_connection_whose_broker_is_gone_gives_up_within_its_bound(fresh_nats: RunningNats) -> None:
    broker = (await EventBus.connect(fresh_nats.url, "tests")).broker
    await broker.start()
    stop_process(fresh_nats.process)
    await asyncio.sleep(1)  # reconnecting now

    started = time.monotonic()
    await broker.close_within(3.0)

    assert time.monotonic() - started < 30.0  # it returns (bounded), where an unbounded close waits for ever


class _Command(BaseModel):
    n: int


class _Idle:
    async def run(self, command: _Command) -> None:
        pass


async def test_a_connection_closed_for_good_leaves_the_event_loop_running(fresh_nats: RunningNats) -> None:
    """nats-py closes a connection for good on the server's `-ERR 'Authorization Violation'` (an auth callout that
    timed out during a reconnect). An idle durable's pull loop then must not hold the event loop: faststream fetches
    again at once on `ConnectionClosedError`, so a fetch raising it without yielding spun for ever and the service
    never acted on its stop (a closed executor hung instead of exiting)."""
    stop = asyncio.Event()
    bus = await EventBus.connect(fresh_nats.url, "tests", stop=stop, grace_s=1.0)
    router = ServiceRouter("tests", dependencies="tests")
    router.durable(Durable(_Command, WORK_STREAM, "closed_idle", "cmd.tests.closed.run", ConsumerPolicy()),
                   _Idle.run, None, "idle")
    broker = bus.broker
    broker.include_router(router)
    broker.context.set_global("tests", _Idle())
    await broker.start()
    await asyncio.sleep(0.5)  # the durable's pull loop waits in a fetch

    starved = threading.Event()

    def unstick() -> None:  # a spinning loop holds the event loop: ended from here, so the test fails, not hangs
        starved.set()
        for subscriber in broker.subscribers:
            subscriber.running = False

    watchdog = threading.Timer(10.0, unstick)
    watchdog.start()
    try:
        await bus.nc._process_err("'Authorization Violation'")  # as the server's -ERR: closed for good
        await asyncio.wait_for(stop.wait(), 5.0)
        for _ in range(10):
            await asyncio.sleep(0.1)  # turns of the event loop, each back in time while nothing holds it
    finally:
        watchdog.cancel()
    assert not starved.is_set(), "the event loop was held after the connection closed"
    await broker.close_within(3.0)
