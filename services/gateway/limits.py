"""Per-key limits on control calls: a token bucket per key, refilled at a steady rate (429 with Retry-After)."""

import math
import time
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
