"""KV bucket helpers: open-or-create, and reading every key's latest value in one watch."""

import nats.errors
import nats.js.errors
from nats.js.kv import KeyValue

from services.runtime.bus import EventBus

SCAN_IDLE_S = 5.0


async def open_bucket(bus: EventBus, bucket: str, ttl_s: float | None = None) -> KeyValue:
    try:
        return await bus.js.key_value(bucket)
    except nats.js.errors.BucketNotFoundError:
        return await bus.js.create_key_value(bucket=bucket, history=1, ttl=ttl_s)


async def latest_values(kv: KeyValue, key_filter: str = ">") -> list[bytes]:
    """The current value of every live key matching `key_filter` (deleted keys are skipped)."""
    return [value for _, value in await latest_entries(kv, key_filter)]


async def latest_entries(kv: KeyValue, key_filter: str = ">") -> list[tuple[str, bytes]]:
    """Every live key matching `key_filter` with its current value (deleted keys are skipped)."""
    watcher = await kv.watch(key_filter, ignore_deletes=True)
    values: list[tuple[str, bytes]] = []
    try:
        while True:
            try:
                entry = await watcher.updates(timeout=SCAN_IDLE_S)
            except nats.errors.TimeoutError:
                break
            if entry is None:  # the end of the initial values
                break
            if entry.value:
                values.append((entry.key, entry.value))
    finally:
        await watcher.stop()
    return values
