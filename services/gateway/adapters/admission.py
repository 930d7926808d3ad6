"""Admission: an owner's limits (batches not ended, bytes stored, keys) decided atomically across gateways. One entry
per owner and limit in the limits bucket lists what was admitted that the read model may not show yet; a take reads it,
then the read model, and writes it back by compare-and-set, so two gateways never both take the last unit. An item
leaves the entry once the read model knows it, or after `GRACE_S` (a crash over-counts a while, never under-counts)."""

import asyncio
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import nats.js.errors
import orjson

from services.gateway.adapters.shared_state import MAX_TRIES, SharedState, SharedStateUnavailable, key_of, ttl_of
from services.gateway.usecases.refusals import ApiError

log = logging.getLogger(__name__)

GRACE_S = 300.0
"""How long an admitted item the read model never showed still counts (its create died before publishing)."""


@dataclass(frozen=True)
class Holdings:
    """What the read model shows an owner holding against one limit."""

    counted: dict[str, int]
    """Items that count now (batches not ended, files not deleted, keys not revoked) and their amounts."""
    known: frozenset[str]
    """Every item the read model knows, counted or not (an ended batch is known and no longer counts)."""


ADMISSION_WAIT_S = 10.0
"""How long one read or write of an owner's entry may take before a 503: a loaded broker is slow, not gone."""
Read = Callable[[frozenset[str]], Awaitable[Holdings]]
"""What the read model shows, given the items the entry lists."""
MAX_SHOWN = 100_000
"""Items remembered as shown by the read model (past this the oldest are looked up again)."""


@dataclass
class Admission:
    """Takes and releases items against an owner's limits in the shared bucket; a take the bucket cannot decide
    (unreachable, or the entry changed by others every time) is refused with 503, never decided alone."""

    store: SharedState
    grace_s: float = GRACE_S
    _shown: OrderedDict[str, None] = field(default_factory=OrderedDict, init=False)
    """Items read back from the read model since admitted: known for good (a record shown stays), never looked up."""

    def shown(self, item: str) -> None:
        """The read model showed `item` (a create read its record back)."""
        self._shown[item] = None
        while len(self._shown) > MAX_SHOWN:
            self._shown.popitem(last=False)

    async def take(self, limit_name: str, owner: str, item: str, amount: int, limit: int, read: Read) -> int | None:
        """Admit `item` (of `amount`) within `limit`: None when admitted (now or before), else what the owner holds."""
        key = key_of(f"admit.{limit_name}", owner)
        try:
            for attempt in range(MAX_TRIES):
                # This gateway's own last write of the entry, while live: the write below proves it still is.
                own = self.store.last_written(key) if attempt == 0 else None
                raw, revision = own or await self.store.get_raw(key)
                listed: dict[str, list[float]] = orjson.loads(raw) if raw else {}
                seen = frozenset(i for i in listed if i in self._shown)
                held = await read(frozenset(listed) - seen)  # after the entry: items leave it once shown
                now = time.time()
                pending = {i: v for i, v in listed.items()
                           if i not in held.known and i not in seen and now - v[1] < self.grace_s}
                used = sum(held.counted.values()) + sum(int(amount) for amount, _ in pending.values())
                if item in pending or item in held.counted or used + amount > limit:
                    if own is not None:
                        continue  # decided without a write, so from the entry as it is now: read it afresh
                    return None if item in pending or item in held.counted else used
                pending[item] = [amount, now]
                try:
                    await self.store.put_raw(key, orjson.dumps(pending), ttl_of(self.grace_s), revision)
                    return None
                except nats.js.errors.KeyWrongLastSequenceError:
                    await asyncio.sleep(random.uniform(0, 0.001 * attempt))
        except SharedStateUnavailable as error:
            # Deciding alone could pass the limit (and the broker that did not answer would have to take the fact).
            log.warning("the %s limit of %s could not be decided: %s", limit_name, owner, error)
        raise ApiError(503, "Too many requests of this owner at once, or the broker is slow; retry shortly.",
                       "server_error", "server_busy", retry_after_s=1)

    async def release(self, limit_name: str, owner: str, item: str) -> None:
        """Forget an item admitted but never published (its create was refused or failed before publishing)."""
        key = key_of(f"admit.{limit_name}", owner)
        try:
            for _ in range(MAX_TRIES):
                raw, revision = await self.store.get_raw(key)
                pending = orjson.loads(raw) if raw else {}
                if item not in pending:
                    return
                del pending[item]
                try:
                    await self.store.put_raw(key, orjson.dumps(pending), ttl_of(self.grace_s), revision)
                    return
                except nats.js.errors.KeyWrongLastSequenceError:
                    continue
        except SharedStateUnavailable as error:  # it stops counting after GRACE_S anyway
            log.info("admitted %s of %s not released (%s); it counts until its grace ends", item, owner, error)

