"""The fleet view: executors' adverts in a KV bucket whose entries expire when heartbeats stop. Each executor writes
only its own key, so the key, not the body, says whose an advert is; a value that does not parse, or parses to
nonsense, is skipped (logged at most once a minute per key); a heartbeat time from the future reads as now."""

import logging
import time

from pydantic import ValidationError

from contracts.events.executor import ExecutorAdvert
from contracts.subjects import EXECUTORS_BUCKET
from services.runtime.nats.bus import EventBus
from services.runtime.nats.kv import Bucket, latest_entries, open_bucket
from services.runtime.process.skip_log import SkipLog

log = logging.getLogger(__name__)

ADVERT_TTL_S = 15.0
MAX_ADVERT_VALUE_BYTES = 64 * 1024
"""The largest advert the bucket takes (twice what a registration's may be: its loaded models may grow). Every tick
the leader reads and parses every advert, and an executor may write its key under any id it was admitted as: with
no bound, one provider's connections made each tick read up to a megabyte per id."""


def read_advert(key: str, value: bytes, now_ms: int) -> ExecutorAdvert:
    """The advert stored under `key`, as the executor of that key's; ValueError when it is not one."""
    advert = ExecutorAdvert.model_validate_json(value)
    return advert.model_copy(update={"executor_id": key, "heartbeat_at": min(advert.heartbeat_at, now_ms)})


class Fleet:
    def __init__(self, kv: Bucket) -> None:
        self.kv = kv
        self.skips = SkipLog(log)

    @classmethod
    async def open(cls, bus: EventBus) -> "Fleet":
        """The core services' view (executors write their own advert alone: `services/executor/adapters/advert.py`)."""
        return cls(await open_bucket(bus, EXECUTORS_BUCKET, ADVERT_TTL_S, max_value_bytes=MAX_ADVERT_VALUE_BYTES))

    async def adverts(self) -> list[ExecutorAdvert]:
        """Every live executor's advert that parses; the others are skipped."""
        # Heartbeats: a replica's moment-old advert serves as well, also while the bucket elects a leader.
        now_ms = int(time.time() * 1000)
        adverts = []
        for key, value in await latest_entries(self.kv, coherent=False):
            try:
                adverts.append(read_advert(key, value, now_ms))
            except ValueError as error:  # pydantic's ValidationError is one
                self.skips.skipped(f"executor advert {key}", _why(error))
        return adverts


def _why(error: ValueError) -> str:
    if isinstance(error, ValidationError):
        first = error.errors()[0]
        return f"not an advert: {'.'.join(map(str, first['loc']))}: {first['msg']}"
    return f"not an advert: {error}"
