"""The executor's own advert in the executors bucket, written as plain JetStream publishes to its key's subject (what
a KV put and delete are): so it needs no look at the bucket's stream, whose info names every other executor."""

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import nats.errors
import nats.js.errors
from nats.js.client import JetStreamContext

from contracts.events.executor import ExecutorAdvert
from contracts.subjects import EXECUTORS_BUCKET, executor_advert
from services.runtime.nats.bus import EventBus
from services.runtime.nats.fleet import ADVERT_TTL_S
from services.runtime.nats.kv import KV_OPERATION, open_bucket

log = logging.getLogger(__name__)

BUCKET_WAIT_S = 60.0
"""How long the first advert waits for the executors bucket to exist."""
FIRST_ADVERT_RETRY_S = 2.0


class OwnAdvert:
    def __init__(self, js: JetStreamContext, executor_id: str) -> None:
        self.js = js
        self.subject = executor_advert(executor_id)

    @classmethod
    async def open(cls, bus: EventBus, executor_id: str, *, declare: bool) -> "OwnAdvert":
        """`declare`: make the bucket when missing (an executor admitted by worker key may not; its scheduler did)."""
        if declare:
            await open_bucket(bus, EXECUTORS_BUCKET, ADVERT_TTL_S)
        return cls(bus.js, executor_id)

    async def advertise(self, advert: ExecutorAdvert) -> None:
        """Publish the advert, asking again for a while as long as the bucket does not exist yet."""
        deadline = time.monotonic() + BUCKET_WAIT_S
        while True:
            try:
                await self.js.publish(self.subject, advert.model_dump_json().encode())
                return
            except (nats.errors.NoRespondersError, nats.js.errors.NoStreamResponseError):
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(0.5)

    async def advertise_first(self, advert_now: Callable[[], ExecutorAdvert],
                              stop: asyncio.Event) -> ExecutorAdvert | None:
        """The first advert (made afresh for each try), asked again until the broker takes it, or None once the
        executor stops first: a broker that cannot write (its disk full, a leader election) is waited out here, not
        answered by a crash and a restart."""
        while not stop.is_set():
            advert = advert_now()
            try:
                await self.advertise(advert)
                return advert
            except (nats.errors.TimeoutError, nats.errors.ConnectionClosedError, nats.errors.StaleConnectionError,
                    nats.js.errors.ServiceUnavailableError) as error:
                log.warning("first advert not taken (%r); asked again in %.0fs", error, FIRST_ADVERT_RETRY_S)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), FIRST_ADVERT_RETRY_S)
        return None

    async def withdraw(self) -> None:
        await self.js.publish(self.subject, headers={KV_OPERATION: "DEL"})
