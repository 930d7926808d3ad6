"""Keys seen live: when each was last used (a KV bucket, written at most once a minute per key and gateway,
never an event), and a watch on the read model that drops a changed key or user from the auth cache at once."""

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import nats.errors
import nats.js.errors
from aiohttp import web
from nats.js.kv import KeyValue

from contracts.subjects import KEY_USAGE_BUCKET
from services.gateway.background.loops import running
from services.gateway.context import DEPS
from services.runtime.nats.kv import open_bucket
from services.runtime.nats.kv_watch import WATCH_INACTIVE_S

log = logging.getLogger(__name__)

WRITE_EVERY_S = 60.0


@dataclass
class KeyUsage:
    kv: KeyValue
    written: OrderedDict[str, float] = field(default_factory=OrderedDict)
    """Per key id written in the last `WRITE_EVERY_S`, when this gateway wrote its time (monotonic), oldest first:
    older entries are dropped as new ones come (keys used once are not kept for ever)."""
    _pending: set["asyncio.Task[None]"] = field(default_factory=set)

    def touch(self, key_id: str) -> None:
        """Record a use of the key, without delaying the request; a minute's precision is enough."""
        now = time.monotonic()
        last = self.written.get(key_id)
        if last is not None and now - last < WRITE_EVERY_S:
            return
        while self.written and now - next(iter(self.written.values())) >= WRITE_EVERY_S:
            self.written.popitem(last=False)
        self.written[key_id] = now
        self.written.move_to_end(key_id)
        task = asyncio.create_task(self._write(key_id, int(time.time() * 1000)))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _write(self, key_id: str, at_ms: int) -> None:
        try:
            await self.kv.put(key_id, str(at_ms).encode())
        except (nats.errors.Error, nats.js.errors.Error) as error:
            self.written.pop(key_id, None)  # try again on the next use
            log.warning("could not record the last use of %s: %r", key_id, error)

    async def last_used_ms(self, key_id: str) -> int | None:
        try:
            entry = await self.kv.get(key_id)
        except nats.js.errors.KeyNotFoundError:
            return None
        return int(entry.value) if entry.value else None


KEY_USAGE = web.AppKey("key_usage", KeyUsage)


async def forward_changes(kv: KeyValue, key_filter: str, changed: Callable[[str], None]) -> None:
    """Call `changed` with every read-model key matching `key_filter` that is written from now on."""
    while True:
        try:
            watcher = await kv.watch(key_filter, inactive_threshold=WATCH_INACTIVE_S)
            try:
                async for entry in watcher:
                    if entry is not None:  # None marks the end of the current values
                        changed(entry.key)
            finally:
                with contextlib.suppress(nats.errors.Error, nats.js.errors.Error):
                    await watcher.stop()
        except (nats.errors.Error, nats.js.errors.Error) as error:
            log.warning("watch on %s interrupted, resuming: %r", key_filter, error)
        await asyncio.sleep(1.0)  # the watch ended or failed: resume it, without spinning


async def keys_kept_fresh(app: web.Application) -> AsyncIterator[None]:
    """A cleanup context (after the connections one): last-used times, and revocations seen within moments."""
    deps = app[DEPS]
    app[KEY_USAGE] = KeyUsage(await open_bucket(deps.bus, KEY_USAGE_BUCKET))
    async with running(*(forward_changes(deps.read_model.kv, pattern, deps.keys.forget)
                         for pattern in ("apikey.>", "user.>"))):
        yield
