"""The executor's own advert in the executors bucket, written as what a KV put and delete are: plain JetStream
publishes to its key's subject. Writing so needs no look at the bucket's stream, whose info would name every other
executor (an executor admitted by worker key may not read it)."""

import asyncio
import time

import nats.errors
import nats.js.errors
from nats.js.client import JetStreamContext

from contracts.events.executor import ExecutorAdvert
from contracts.subjects import EXECUTORS_BUCKET, executor_advert
from services.runtime.nats.bus import EventBus
from services.runtime.nats.fleet import ADVERT_TTL_S
from services.runtime.nats.kv import KV_OPERATION, open_bucket

BUCKET_WAIT_S = 60.0
"""How long the first advert waits for the executors bucket to exist."""


class OwnAdvert:
    def __init__(self, js: JetStreamContext, executor_id: str) -> None:
        self.js = js
        self.executor_id = executor_id
        self.subject = executor_advert(executor_id)

    @classmethod
    async def open(cls, bus: EventBus, executor_id: str, *, declare: bool) -> "OwnAdvert":
        """`declare`: make the bucket when missing (on a broker that asks nobody who they are, this executor may
        come up first); an admitted executor may not, and finds it made by the scheduler admitting it."""
        if declare:
            await open_bucket(bus, EXECUTORS_BUCKET, ADVERT_TTL_S)
        return cls(bus.js, executor_id)

    async def advertise(self, advert: ExecutorAdvert) -> None:
        """Publish the advert; while the bucket does not exist yet (the scheduler that admits executors makes it, and
        on a broker without authentication this executor may come up first) ask again for a while."""
        deadline = time.monotonic() + BUCKET_WAIT_S
        while True:
            try:
                await self.js.publish(self.subject, advert.model_dump_json().encode())
                return
            except (nats.errors.NoRespondersError, nats.js.errors.NoStreamResponseError):
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(0.5)

    async def withdraw(self) -> None:
        await self.js.publish(self.subject, headers={KV_OPERATION: "DEL"})
