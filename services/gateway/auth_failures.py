"""Brute force on keys: failed authentications per client address; past the limit every key is refused a while."""

import math
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from aiohttp import web

from services.gateway.errors import ApiError

MAX_ADDRESSES = 100_000
"""Addresses tracked at once; the least recently failing are forgotten first, so memory stays bounded."""


@dataclass
class FailedAuthentications:
    """A sliding window per address: after `limit` failures within `window_s`, the address waits until the oldest
    of them leaves the window. Successes neither count nor forgive."""

    limit: int
    window_s: float
    failures: OrderedDict[str, deque[float]] = field(default_factory=OrderedDict)

    def wait_s(self, address: str, now: float | None = None) -> float:
        """0 when `address` may try a key now, else how long until it may."""
        times = self.failures.get(address)
        if times is None:
            return 0.0
        now = time.monotonic() if now is None else now
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if not times:
            del self.failures[address]
            return 0.0
        return times[0] + self.window_s - now if len(times) >= self.limit else 0.0

    def record_failure(self, address: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        times = self.failures.pop(address, None) or deque(maxlen=max(self.limit, 1))
        times.append(now)
        self.failures[address] = times
        while len(self.failures) > MAX_ADDRESSES:
            self.failures.popitem(last=False)


AUTH_FAILURES = web.AppKey("auth_failures", FailedAuthentications)


def client_address(request: web.Request) -> str:
    return request.remote or "unknown"


def refuse_if_blocked(request: web.Request) -> None:
    failures = request.app.get(AUTH_FAILURES)
    wait = 0.0 if failures is None else failures.wait_s(client_address(request))
    if wait > 0:
        retry_after = max(1, math.ceil(wait))
        raise ApiError(429, f"Too many failed authentications from this address; retry in {retry_after}s.",
                       "rate_limit_error", "too_many_failed_authentications", retry_after_s=retry_after)


def count_failure(request: web.Request) -> None:
    failures = request.app.get(AUTH_FAILURES)
    if failures is not None:
        failures.record_failure(client_address(request))
