"""The fleet view: executors' adverts in a KV bucket whose entries expire when heartbeats stop."""

from nats.js.kv import KeyValue

from contracts.events.executor import ExecutorAdvert
from contracts.subjects import EXECUTORS_BUCKET
from services.runtime.bus import EventBus
from services.runtime.kv import latest_values, open_bucket

ADVERT_TTL_S = 15.0


class Fleet:
    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv

    @classmethod
    async def open(cls, bus: EventBus, scans: bool = True) -> "Fleet":
        """`scans=False` for executors: they only write their own advert (and may not reconfigure the bucket)."""
        return cls(await open_bucket(bus, EXECUTORS_BUCKET, ADVERT_TTL_S, scans=scans))

    async def advertise(self, advert: ExecutorAdvert) -> None:
        await self.kv.put(advert.executor_id, advert.model_dump_json().encode())

    async def withdraw(self, executor_id: str) -> None:
        await self.kv.delete(executor_id)

    async def adverts(self) -> list[ExecutorAdvert]:
        # Heartbeats: a replica's moment-old advert serves as well, also while the bucket elects a leader.
        return [ExecutorAdvert.model_validate_json(value) for value in await latest_values(self.kv, coherent=False)]
