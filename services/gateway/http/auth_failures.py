"""Brute force on keys: failed authentications per client address, refusing guesses without refusing right keys.

A generated key (`new_api_key`: 256 random bits) cannot be guessed online, so it is always looked up; past its
address's budget wrong ones get 429, not 401. Any other key (a chosen `SHESHNAG_ADMIN_KEY`) could be guessed, so while
its address is over budget only an identity (its first half) that succeeded there before is looked up, with
`IDENTITY_LIMIT` wrong tries a window: the answers are no guesser's oracle (a weak key new to that address waits).
The tables are shared by every gateway (`shared_state`); each also keeps its own (bounded, LRU) as a fallback.
"""

import asyncio
import contextlib
import hashlib
import math
import re
import time
from collections import OrderedDict
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TypeVar

from aiohttp import web

from services.gateway.adapters.shared_state import SharedState, SharedStateUnavailable, key_of, ttl_of
from services.gateway.usecases.refusals import ApiError
from services.runtime.process.keyed_locks import KeyedLocks

MAX_ENTRIES = 100_000
"""Addresses, and (address, identity) pairs, tracked per table; the least recently touched go first."""
IDENTITY_LIMIT = 10
"""Wrong tries one (address, identity) gets per window while its address is over budget."""
TRUST_S = 24 * 3600.0
"""How long a success of a guessable key keeps its identity looked up at that address."""
TRUST_REFRESH_S = 3600.0
"""How often a gateway writes a key's continued successes to the shared table (a success costs no write between)."""
GENERATED_KEY = re.compile(r"(?:gk|wk)-[A-Za-z0-9_-]{43,}")
"""The shape `new_api_key` makes: `token_urlsafe(32)` is 43 characters."""
MIN_DISTINCT = 16
"""A random 43-character body has ~31 distinct characters; a chosen one of that shape with fewer counts as weak."""


def unguessable(key: str) -> bool:
    return GENERATED_KEY.fullmatch(key) is not None and len(set(key[3:])) >= MIN_DISTINCT


def identity(address: str, key: str) -> str:
    """What a guessable key is known by at an address: a digest of the address and the key's first half."""
    # A header's bytes that are not UTF-8 reach us as lone surrogates: digested escaped, never an error.
    return hashlib.sha256(f"{address}\x1f{key[:len(key) // 2]}".encode(errors="backslashreplace")).hexdigest()


def recent(times: Sequence[float], now: float, window_s: float, limit: int) -> list[float]:
    """The latest `limit` of `times` still within the window ending at `now`, oldest first."""
    kept = sorted(t for t in times if t > now - window_s)
    return kept[-limit:] if limit > 0 else []


def wait_of(times: Sequence[float], now: float, window_s: float, limit: int) -> float:
    """0 while `times` hold fewer than `limit` failures within the window, else until the oldest of them leaves."""
    kept = recent(times, now, window_s, limit)
    return kept[0] + window_s - now if limit > 0 and len(kept) >= limit else 0.0


def refusal(address_wait: float, trusted_at: float | None, identity_times: Sequence[float], now: float,
            window_s: float) -> float:
    """How long a guessable key must wait at an address `address_wait` over budget: all of it unless its identity
    succeeded there within `TRUST_S`; then only once its own `IDENTITY_LIMIT` tries of the window are spent."""
    if address_wait == 0.0:
        return 0.0
    if trusted_at is None or now - trusted_at >= TRUST_S:
        return address_wait
    return wait_of(identity_times, now, window_s, IDENTITY_LIMIT)


def with_failure(times: Sequence[float] | None, now: float, window_s: float, limit: int) -> list[float]:
    return recent([*(times or ()), now], now, window_s, limit)


V = TypeVar("V")


def _touch(table: OrderedDict[str, V], key: str, value: V) -> None:
    table.pop(key, None)
    table[key] = value
    while len(table) > MAX_ENTRIES:
        table.popitem(last=False)


@dataclass
class FailedAuthentications:
    """One gateway's own tables (the shared ones' stand-in): failures per address and per (address, identity) of
    guessable keys, and identities that succeeded per address. Successes neither count nor forgive."""

    limit: int
    window_s: float
    failures: OrderedDict[str, list[float]] = field(default_factory=OrderedDict)
    identity_failures: OrderedDict[str, list[float]] = field(default_factory=OrderedDict)
    trusted: OrderedDict[str, float] = field(default_factory=OrderedDict)

    def wait_s(self, address: str, now: float | None = None) -> float:
        """0 while `address` is within its budget, else how long until its oldest failure leaves the window."""
        now = time.time() if now is None else now
        times = self.failures.get(address)
        if times is None:
            return 0.0
        if not recent(times, now, self.window_s, self.limit):
            del self.failures[address]
            return 0.0
        return wait_of(times, now, self.window_s, self.limit)

    def refusal_s(self, address: str, key: str, now: float | None = None) -> float:
        """0 when `key` may be looked up now, else how long `address` should wait before presenting it."""
        if unguessable(key):
            return 0.0
        now = time.time() if now is None else now
        ident = identity(address, key)
        return refusal(self.wait_s(address, now), self.trusted.get(ident), self.identity_failures.get(ident, []),
                       now, self.window_s)

    def record_failure(self, address: str, key: str, now: float | None = None) -> float:
        """Count a wrong key; return how long the address should now wait (0: it is within its budget)."""
        now = time.time() if now is None else now
        _touch(self.failures, address, with_failure(self.failures.get(address), now, self.window_s, self.limit))
        if not unguessable(key):
            ident = identity(address, key)
            _touch(self.identity_failures, ident,
                   with_failure(self.identity_failures.get(ident), now, self.window_s, IDENTITY_LIMIT))
        return self.wait_s(address, now)

    def record_success(self, address: str, key: str, now: float | None = None) -> None:
        if not unguessable(key):  # only guessable keys need their identity trusted
            _touch(self.trusted, identity(address, key), time.time() if now is None else now)


@dataclass
class SharedFailedAuthentications:
    """The same rules over tables every gateway shares (one budget per guesser, whichever gateway it reaches), each
    event also kept in `local`, which answers while the shared ones cannot (logged)."""

    store: SharedState
    local: FailedAuthentications
    trust_written: OrderedDict[str, float] = field(default_factory=OrderedDict)
    """Per identity, when this gateway last wrote its success to the shared table."""
    first_tries: KeyedLocks = field(default_factory=KeyedLocks)
    """Per identity not yet trusted here: its requests checked one at a time (`first_try`)."""

    def first_try(self, address: str, key: str) -> AbstractAsyncContextManager[None]:
        """Held around one check of a guessable key this gateway has not seen succeed at the address: requests of
        the same key sent at once are checked one after another, so the first success trusts it for the rest rather
        than each taking a failure of the budget before it is looked up (a burst of a chosen admin key's requests
        from a new address was refused in part). Guesses of different keys are not held up by each other."""
        if unguessable(key):
            return contextlib.nullcontext()
        ident = identity(address, key)
        if time.time() - self.trust_written.get(ident, -math.inf) < TRUST_REFRESH_S:
            return contextlib.nullcontext()
        return self.first_tries.hold(ident)

    def entry(self, kind: str, name: str) -> str:
        """The shared entry of `name` (an address, an identity) in the table `kind`."""
        return key_of(kind, name, self.local.limit, self.local.window_s)

    async def refusal_s(self, address: str, key: str, now: float | None = None) -> float:
        if unguessable(key):
            return 0.0
        now = time.time() if now is None else now
        own = self.local.refusal_s(address, key, now)
        try:
            wait = wait_of(await self.store.read(self.entry("auth", address)) or [], now, self.local.window_s,
                           self.local.limit)
            if wait == 0.0:
                return 0.0
            ident = identity(address, key)
            trusted, tries = await asyncio.gather(self.store.read(self.entry("trust", ident)),
                                                  self.store.read(self.entry("guess", ident)))
        except SharedStateUnavailable as error:
            self.store.fell_back("the brute-force limit", error)
            return own
        return refusal(wait, trusted[0] if trusted else None, tries or [], now, self.local.window_s)

    async def reserve(self, address: str, key: str, now: float | None = None) -> tuple[float, float | None]:
        """`refusal_s`, decided and counted at once: a guessable key new to the address takes one of its failures
        before it is looked up (by compare-and-set), so guesses sent at once never all read the budget before any is
        counted. (wait, the failure reserved: `record_failure` keeps it, `record_success` gives it back)."""
        if unguessable(key):
            return 0.0, None
        now = time.time() if now is None else now
        try:
            trusted = await self.store.read(self.entry("trust", identity(address, key)))
        except SharedStateUnavailable as error:
            self.store.fell_back("the brute-force limit", error)
            return self.local.refusal_s(address, key, now), None
        if trusted and now - trusted[0] < TRUST_S:
            return await self.refusal_s(address, key, now), None  # its owner's key, known here: a guesser has none
        window_s, limit = self.local.window_s, self.local.limit

        def taken(times: list[float] | None) -> tuple[list[float] | None, float]:
            wait = wait_of(times or [], now, window_s, limit)
            return (None, wait) if wait > 0 else (with_failure(times, now, window_s, limit), 0.0)

        try:
            wait = await self.store.change(self.entry("auth", address), taken, ttl_of(window_s))
        except SharedStateUnavailable as error:
            self.store.fell_back("the brute-force limit", error)
            return self.local.refusal_s(address, key, now), None
        return (wait, None) if wait > 0 else (0.0, now)

    async def record_failure(self, address: str, key: str, now: float | None = None,
                             reserved: float | None = None) -> float:
        now = time.time() if now is None else now
        own = self.local.record_failure(address, key, now)
        window_s, limit = self.local.window_s, self.local.limit
        held = round(reserved, 3) if reserved is not None else None

        def counted(times: list[float] | None) -> tuple[list[float] | None, float]:
            if held is not None and held in (times or ()):  # counted when it was reserved
                return None, wait_of(times or [], now, window_s, limit)
            kept = with_failure(times, now, window_s, limit)
            return kept, wait_of(kept, now, window_s, limit)

        def tried(times: list[float] | None) -> tuple[list[float], None]:
            return with_failure(times, now, window_s, IDENTITY_LIMIT), None

        counting = self.store.change(self.entry("auth", address), counted, ttl_of(window_s))
        try:
            if unguessable(key):
                return await counting
            wait, _ = await asyncio.gather(counting, self.store.change(self.entry("guess", identity(address, key)),
                                                                       tried, ttl_of(window_s)))
        except SharedStateUnavailable as error:
            self.store.fell_back("the brute-force limit", error)
            return own
        return wait

    async def give_back(self, address: str, reserved: float) -> None:
        """A reserved failure that was no failure (the key was right, or revoked: not a guess) leaves the count."""
        held = round(reserved, 3)

        def without(times: list[float] | None) -> tuple[list[float] | None, None]:
            if held not in (times or ()):
                return None, None
            kept = list(times or ())
            kept.remove(held)
            return kept, None

        try:
            await self.store.change(self.entry("auth", address), without, ttl_of(self.local.window_s))
        except SharedStateUnavailable as error:
            self.store.fell_back("the brute-force limit", error)

    async def record_success(self, address: str, key: str, now: float | None = None) -> None:
        if unguessable(key):
            return
        now = time.time() if now is None else now
        self.local.record_success(address, key, now)
        ident = identity(address, key)
        if now - self.trust_written.get(ident, -math.inf) < TRUST_REFRESH_S:
            return
        try:
            await self.store.put(self.entry("trust", ident), [now], ttl_of(TRUST_S))
        except SharedStateUnavailable as error:
            self.store.fell_back("the brute-force limit", error)
            return
        _touch(self.trust_written, ident, now)


AUTH_FAILURES = web.AppKey("auth_failures", SharedFailedAuthentications)


def too_many(wait_s: float) -> ApiError:
    retry_after = max(1, math.ceil(wait_s))
    return ApiError(429, f"Too many failed authentications from this address; retry in {retry_after}s.",
                    "rate_limit_error", "too_many_failed_authentications", retry_after_s=retry_after)
