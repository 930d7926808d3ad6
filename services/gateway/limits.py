"""Limits: control calls per key (a token bucket, 429 with Retry-After) and transfers per gateway (bounded slots)."""

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aiohttp import web

from services.gateway.auth import principal
from services.gateway.errors import ApiError


@dataclass
class _Bucket:
    tokens: float
    updated: float


@dataclass
class ControlCallLimiter:
    """Creates, cancels and deletes spend a token each; reads and batch lines never do."""

    rate_per_s: float
    burst: int
    buckets: dict[str, _Bucket] = field(default_factory=dict)

    def wait_s(self, key_id: str, now: float | None = None) -> float:
        """Spend one token for `key_id`; 0 when allowed, else how long until a token is there."""
        now = time.monotonic() if now is None else now
        bucket = self.buckets.setdefault(key_id, _Bucket(float(self.burst), now))
        bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.updated) * self.rate_per_s)
        bucket.updated = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return 0.0
        return (1.0 - bucket.tokens) / self.rate_per_s if self.rate_per_s > 0 else math.inf


CONTROL_LIMITER = web.AppKey("control_limiter", ControlCallLimiter)


def charge_control_call(request: web.Request) -> None:
    wait = request.app[CONTROL_LIMITER].wait_s(principal(request).key_id)
    if wait > 0:
        retry_after = max(1, math.ceil(min(wait, 120.0)))
        raise ApiError(429, f"Too many control calls for this key; retry in {retry_after}s.", "rate_limit_error",
                       "rate_limit_exceeded", retry_after_s=retry_after)


class TransferSlots:
    """At most `slots` uploads (or downloads) at once; one more waits up to `wait_s` for a slot, then gets 503."""

    def __init__(self, slots: int, wait_s: float) -> None:
        self.semaphore = asyncio.Semaphore(slots)
        self.wait_s = wait_s

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        try:
            async with asyncio.timeout(self.wait_s):
                await self.semaphore.acquire()
        except TimeoutError:
            raise ApiError(503, "The server is busy with other transfers; retry shortly.", "server_error",
                           "server_busy", retry_after_s=5) from None
        try:
            yield
        finally:
            self.semaphore.release()


UPLOAD_SLOTS = web.AppKey("upload_slots", TransferSlots)
DOWNLOAD_SLOTS = web.AppKey("download_slots", TransferSlots)
