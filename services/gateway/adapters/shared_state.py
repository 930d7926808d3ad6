"""Counts every gateway on one broker shares (control-call buckets, failed authentications): a short list of numbers
per key in a KV bucket, changed by compare-and-set, each write expiring on its own (per-message TTL). Raw writes
(admission's) are remembered while surely live, so a compare-and-set may start from memory; counts never are. Each
call has `TIMEOUT_S`; after a failure callers get `SharedStateUnavailable` at once for `RETRY_AFTER_S`."""

import asyncio
import hashlib
import logging
import math
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import nats.errors
import nats.js.errors
import orjson
from nats.js import api

from services.runtime.nats.kv import Bucket

log = logging.getLogger(__name__)

TIMEOUT_S = 2.0
"""The longest one read or write may take (a busy broker can take a second) before own counts answer."""
RETRY_AFTER_S = 5.0
"""How long after a failure the bucket is left alone (a request pays no timeout meanwhile)."""
MAX_TRIES = 64
"""Compare-and-set attempts for one change; past them (a key written by many at once) the change is given up."""
MAX_TTL_S = 24 * 3600.0
"""No entry outlives this, whatever its window."""
MAX_WRITTEN = 10_000
"""Keys whose last raw write this gateway remembers; past this the least recently written go first (read again)."""
EXPIRY_MARGIN_S = 1.0
"""A write is remembered until this long before the broker would expire it."""

Numbers = list[float]
R = TypeVar("R")
Step = Callable[[Numbers | None], tuple[Numbers | None, R]]
"""The current value (None: no live entry) → the value to write (None: write nothing) and what to answer."""


class SharedStateUnavailable(Exception):
    """The bucket could not be read or changed in time: answer from this gateway's own counts."""

    def __init__(self, why: str, *, first: bool) -> None:
        super().__init__(why)
        self.first = first
        """Whether this is the failure that began an outage (the one worth a log line)."""


def key_of(kind: str, name: str, *settings: object) -> str:
    """A KV key for any name (an address may hold ':' or '%'), apart for each `settings` (a limit and its window):
    gateways configured alike share a count, others (mid-rollout) keep apart."""
    return f"{kind}.{hashlib.sha256(repr((name, *settings)).encode()).hexdigest()[:40]}"


def ttl_of(seconds: float) -> float:
    return float(min(MAX_TTL_S, max(1, math.ceil(seconds) + 1)))


@dataclass
class SharedState:
    """The bucket as the limits use it: read a key, put one, change one by compare-and-set."""

    kv: Bucket
    timeout_s: float = TIMEOUT_S
    retry_after_s: float = RETRY_AFTER_S
    _down_until: float = 0.0
    _written: OrderedDict[str, tuple[bytes, int, float]] = field(default_factory=OrderedDict, init=False)
    """Per key, this gateway's last raw write: bytes, revision, and until when (monotonic) it is surely live."""

    async def read(self, key: str) -> Numbers | None:
        raw, _ = await self.get_raw(key)
        return orjson.loads(raw) if raw else None

    async def put(self, key: str, value: Sequence[float], ttl_s: float) -> None:
        await self._publish(key, value, ttl_s, None)

    async def change(self, key: str, step: Step[R], ttl_s: float) -> R:
        """Apply `step` to the key's value by compare-and-set, retried on a race: every writer's change counts once."""
        for attempt in range(MAX_TRIES):
            raw, revision = await self.get_raw(key)
            value, answer = step(orjson.loads(raw) if raw else None)
            if value is None:
                return answer
            try:
                await self._publish(key, value, ttl_s, revision)
                return answer
            except nats.js.errors.KeyWrongLastSequenceError:
                await asyncio.sleep(random.uniform(0, 0.001 * attempt))  # spread the writers racing for this key
        raise SharedStateUnavailable(f"{key} changed by others {MAX_TRIES} times in a row", first=True)

    def fell_back(self, what: str, error: SharedStateUnavailable) -> None:
        """Say (once per outage) that this gateway answers from its own counts for now."""
        if error.first:
            log.warning("shared limits unavailable (%s); %s uses this gateway's own counts for now", error, what)

    def last_written(self, key: str) -> tuple[bytes, int] | None:
        """This gateway's last raw write of the key and its revision, while surely live."""
        written = self._written.get(key)
        if written is None or time.monotonic() >= written[2]:
            return None
        return written[0], written[1]

    async def _publish(self, key: str, value: Sequence[float], ttl_s: float, revision: int | None) -> None:
        await self._write(key, orjson.dumps([round(v, 3) for v in value]), ttl_s, revision)

    async def get_raw(self, key: str) -> tuple[bytes | None, int]:
        """The key's bytes (None: no live entry) and the revision a compare-and-set names."""
        self._refuse_while_down()
        try:
            async with asyncio.timeout(self.timeout_s):
                entry = await self.kv.get(key)
        except nats.js.errors.KeyNotFoundError as missing:  # never written, or expired
            return None, missing.entry.revision if missing.entry is not None else 0
        except (TimeoutError, nats.errors.Error, OSError) as error:
            raise self._unavailable(repr(error)) from error
        return entry.value or None, entry.revision or 0

    async def put_raw(self, key: str, data: bytes, ttl_s: float, revision: int | None) -> None:
        """Write `data` (with a `revision`, only while it is still the key's last), remembered while surely live."""
        self._written.pop(key, None)
        sequence = await self._write(key, data, ttl_s, revision)
        self._written[key] = (data, sequence, time.monotonic() + ttl_s - EXPIRY_MARGIN_S)
        while len(self._written) > MAX_WRITTEN:
            self._written.popitem(last=False)

    async def _write(self, key: str, data: bytes, ttl_s: float, revision: int | None) -> int:
        """Write `data` (see `put_raw`); its sequence, the key's revision."""
        self._refuse_while_down()
        headers = None if revision is None else {str(api.Header.EXPECTED_LAST_SUBJECT_SEQUENCE.value): str(revision)}
        try:
            async with asyncio.timeout(self.timeout_s):
                ack = await self.kv.js.publish(f"{self.kv.prefix}{key}", data, headers=headers, msg_ttl=ttl_s)
        except nats.js.errors.APIError as error:
            if error.err_code in (10071, 10164):  # wrong last sequence: another writer came first
                raise nats.js.errors.KeyWrongLastSequenceError(description=error.description) from error
            raise self._unavailable(repr(error)) from error
        except (TimeoutError, nats.errors.Error, OSError) as error:
            raise self._unavailable(repr(error)) from error
        return ack.seq

    def _refuse_while_down(self) -> None:
        if time.monotonic() < self._down_until:
            raise SharedStateUnavailable("the bucket failed moments ago", first=False)

    def _unavailable(self, why: str) -> SharedStateUnavailable:
        self._down_until = time.monotonic() + self.retry_after_s
        return SharedStateUnavailable(why, first=True)
