"""The fleet view: executors' adverts in a KV bucket whose entries expire when heartbeats stop."""

import nats.errors
import nats.js.errors
from nats.js.kv import KeyValue

from contracts.events.executor import ExecutorAdvert
from contracts.subjects import EXECUTORS_BUCKET
from services.runtime.bus import EventBus

ADVERT_TTL_S = 15.0


class Fleet:
    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv

    @classmethod
    async def open(cls, bus: EventBus) -> "Fleet":
        try:
            kv = await bus.js.key_value(EXECUTORS_BUCKET)
        except nats.js.errors.BucketNotFoundError:
            kv = await bus.js.create_key_value(bucket=EXECUTORS_BUCKET, history=1, ttl=ADVERT_TTL_S)
        return cls(kv)

    async def advertise(self, advert: ExecutorAdvert) -> None:
        await self.kv.put(advert.executor_id, advert.model_dump_json().encode())

    async def withdraw(self, executor_id: str) -> None:
        await self.kv.delete(executor_id)

    async def adverts(self) -> list[ExecutorAdvert]:
        watcher = await self.kv.watchall(ignore_deletes=True)
        found: list[ExecutorAdvert] = []
        try:
            while True:
                try:
                    entry = await watcher.updates(timeout=2.0)
                except nats.errors.TimeoutError:
                    break
                if entry is None:
                    break
                if entry.value:
                    found.append(ExecutorAdvert.model_validate_json(entry.value))
        finally:
            await watcher.stop()
        return found
