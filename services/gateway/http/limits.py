"""Limits: control calls per owner (a user's keys together, or a key of no user: a token bucket shared by every
gateway, 429 with Retry-After). Transfers per gateway are `transfer_slots.py`'s."""

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from aiohttp import web

from services.gateway.adapters.shared_state import MAX_TTL_S, SharedState, SharedStateUnavailable, key_of, ttl_of
from services.gateway.http.auth import principal
from services.gateway.usecases.refusals import ApiError


def spend(bucket: Sequence[float] | None, now: float, rate_per_s: float, burst: int) -> tuple[list[float], float]:
    """A token bucket `[tokens, updated]` (None: full) after one call at `now`, and 0 when it may go, else how long
    until a token is there. A clock behind the last writer's adds nothing, and never moves `updated` back."""
    tokens, updated = (bucket[0], bucket[1]) if bucket else (float(burst), now)
    tokens = min(float(burst), tokens + max(0.0, now - updated) * rate_per_s)
    updated = max(updated, now)
    if tokens >= 1.0:
        return [tokens - 1.0, updated], 0.0
    return [tokens, updated], (1.0 - tokens) / rate_per_s if rate_per_s > 0 else math.inf


OWN_BUCKETS_KEPT = 10_000
"""Own buckets kept before the full ones are forgotten: memory bounded by the owners active in one refill time."""


@dataclass
class ControlCallLimiter:
    """Creates, cancels and deletes spend a token each (reads and lines never do) from buckets every gateway shares,
    each expiring once it would be full again; this gateway's own `buckets` answer while those cannot be reached."""

    store: SharedState
    rate_per_s: float
    burst: int
    buckets: dict[str, list[float]] = field(default_factory=dict)
    forget_at: int = OWN_BUCKETS_KEPT
    """Past this many own buckets, the full ones are forgotten (a full bucket is one never spent)."""

    async def wait_s(self, key_id: str, now: float | None = None) -> float:
        """Spend one token for `key_id`; 0 when allowed, else how long until a token is there."""
        now = time.time() if now is None else now
        rate, burst = self.rate_per_s, self.burst
        self.buckets[key_id], own = spend(self.buckets.get(key_id), now, rate, burst)
        if len(self.buckets) > self.forget_at:
            self.forget_full(now)

        def spent(bucket: list[float] | None) -> tuple[list[float] | None, float]:
            after, wait = spend(bucket, now, rate, burst)
            return (after if wait == 0.0 else None), wait

        try:
            return await self.store.change(key_of("calls", key_id, rate, burst), spent,
                                           ttl_of(burst / rate if rate > 0 else MAX_TTL_S))
        except SharedStateUnavailable as error:
            self.store.fell_back("the control-call limit", error)
            return own

    def forget_full(self, now: float) -> None:
        """Drop every own bucket that has filled again; the next bound is twice what is left (amortized: a busy
        gateway does not scan on every call)."""
        refill = self.rate_per_s
        self.buckets = {owner: bucket for owner, bucket in self.buckets.items()
                        if bucket[0] + max(0.0, now - bucket[1]) * refill < self.burst}
        self.forget_at = max(OWN_BUCKETS_KEPT, 2 * len(self.buckets))


CONTROL_LIMITER = web.AppKey("control_limiter", ControlCallLimiter)


async def charge_control_call(request: web.Request) -> None:
    """Spend one of the owner's control calls: all of a user's keys share one bucket, so more keys buy no more."""
    wait = await request.app[CONTROL_LIMITER].wait_s(principal(request).owner)
    if wait > 0:
        retry_after = max(1, math.ceil(min(wait, 120.0)))
        raise ApiError(429, f"Too many control calls for this account; retry in {retry_after}s.", "rate_limit_error",
                       "rate_limit_exceeded", retry_after_s=retry_after)
