"""Brute force on keys: failed authentications per client address, refusing guesses without refusing right keys.

A key made by `new_api_key` (`gk-`/`wk-` and 256 random bits) cannot be guessed online, so it is always looked up:
one address's wrong keys never refuse another's right key. Past the address's budget its wrong ones get 429, not
401, telling a client to slow down; that such a guesser still sees a right key succeed gives it nothing to search.

Any other key (a chosen `SHESHNAG_ADMIN_KEY`; every guess at one) could be guessed, and while its address is over
budget, answering its guesses would be that guesser's oracle. So then only a key whose identity (its first half)
succeeded from this address before is looked up, and each identity gets just `IDENTITY_LIMIT` wrong tries a window;
the rest get 429 unlooked. A weak key in use keeps working behind a proxy that guesses; what a guesser can learn
is whether a first half is in use there, and then the second half at `IDENTITY_LIMIT` a window. A weak key first
used from an address while it is over budget waits for the window to pass. Every table is bounded (LRU).
"""

import hashlib
import math
import re
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import TypeVar

from aiohttp import web

from services.gateway.errors import ApiError

MAX_ENTRIES = 100_000
"""Addresses, and (address, identity) pairs, tracked per table; the least recently touched go first."""
IDENTITY_LIMIT = 10
"""Wrong tries one (address, identity) gets per window while its address is over budget."""
TRUST_S = 24 * 3600.0
"""How long a success of a guessable key keeps its identity looked up at that address."""
GENERATED_KEY = re.compile(r"(?:gk|wk)-[A-Za-z0-9_-]{43,}")
"""The shape `new_api_key` makes: `token_urlsafe(32)` is 43 characters."""
MIN_DISTINCT = 16
"""A random 43-character body has ~31 distinct characters; a chosen one of that shape with fewer counts as weak."""


def unguessable(key: str) -> bool:
    return GENERATED_KEY.fullmatch(key) is not None and len(set(key[3:])) >= MIN_DISTINCT


def identity(address: str, key: str) -> str:
    """What a guessable key is known by at an address: a digest of the address and the key's first half."""
    return hashlib.sha256(f"{address}\x1f{key[:len(key) // 2]}".encode()).hexdigest()


def _window(times: deque[float], now: float, window_s: float) -> deque[float]:
    while times and times[0] <= now - window_s:
        times.popleft()
    return times


V = TypeVar("V")


def _touch(table: OrderedDict[str, V], key: str, value: V) -> None:
    table.pop(key, None)
    table[key] = value
    while len(table) > MAX_ENTRIES:
        table.popitem(last=False)


@dataclass
class FailedAuthentications:
    """A sliding window of failures per address (`limit` within `window_s`), one per (address, identity) of
    guessable keys, and the identities that succeeded at each address. Successes neither count nor forgive."""

    limit: int
    window_s: float
    failures: OrderedDict[str, deque[float]] = field(default_factory=OrderedDict)
    identity_failures: OrderedDict[str, deque[float]] = field(default_factory=OrderedDict)
    trusted: OrderedDict[str, float] = field(default_factory=OrderedDict)

    def wait_s(self, address: str, now: float | None = None) -> float:
        """0 while `address` is within its budget, else how long until its oldest failure leaves the window."""
        now = time.monotonic() if now is None else now
        times = self.failures.get(address)
        if times is None:
            return 0.0
        if not _window(times, now, self.window_s):
            del self.failures[address]
            return 0.0
        return times[0] + self.window_s - now if len(times) >= self.limit else 0.0

    def refusal_s(self, address: str, key: str, now: float | None = None) -> float:
        """0 when `key` may be looked up now, else how long `address` should wait before presenting it."""
        now = time.monotonic() if now is None else now
        wait = self.wait_s(address, now)
        if wait == 0.0 or unguessable(key):
            return 0.0
        ident = identity(address, key)
        if now - self.trusted.get(ident, -math.inf) >= TRUST_S:
            return wait
        times = _window(self.identity_failures.get(ident, deque()), now, self.window_s)
        return times[0] + self.window_s - now if len(times) >= IDENTITY_LIMIT else 0.0

    def record_failure(self, address: str, key: str, now: float | None = None) -> float:
        """Count a wrong key; return how long the address should now wait (0: it is within its budget)."""
        now = time.monotonic() if now is None else now
        times = self.failures.get(address) or deque(maxlen=max(self.limit, 1))
        times.append(now)
        _touch(self.failures, address, times)
        if not unguessable(key):
            ident = identity(address, key)
            tries = self.identity_failures.get(ident) or deque(maxlen=IDENTITY_LIMIT)
            tries.append(now)
            _touch(self.identity_failures, ident, tries)
        return self.wait_s(address, now)

    def record_success(self, address: str, key: str, now: float | None = None) -> None:
        if not unguessable(key):  # only guessable keys need their identity trusted
            _touch(self.trusted, identity(address, key), time.monotonic() if now is None else now)


AUTH_FAILURES = web.AppKey("auth_failures", FailedAuthentications)


def client_address(request: web.Request) -> str:
    return request.remote or "unknown"


def too_many(wait_s: float) -> ApiError:
    retry_after = max(1, math.ceil(wait_s))
    return ApiError(429, f"Too many failed authentications from this address; retry in {retry_after}s.",
                    "rate_limit_error", "too_many_failed_authentications", retry_after_s=retry_after)


def refuse_if_blocked(request: web.Request, key: str) -> None:
    """Before the lookup: 429 for a key this address may not try now."""
    failures = request.app.get(AUTH_FAILURES)
    wait = 0.0 if failures is None else failures.refusal_s(client_address(request), key)
    if wait > 0:
        raise too_many(wait)


def count_failure(request: web.Request, key: str) -> float:
    """After a failed lookup: how long the address should wait (0: answer 401 as usual)."""
    failures = request.app.get(AUTH_FAILURES)
    return 0.0 if failures is None else failures.record_failure(client_address(request), key)


def count_success(request: web.Request, key: str) -> None:
    failures = request.app.get(AUTH_FAILURES)
    if failures is not None:
        failures.record_success(client_address(request), key)
