"""One active process of a role (the scheduler, the ledger): a leader lease in a KV bucket whose entries expire
unless renewed; the others stand by."""

import asyncio
import contextlib
import logging
import math
import re
import socket
import time

import nats.errors
import nats.js.errors
from nats.js.kv import KeyValue

from contracts.subjects import LEADER_BUCKET, SCHEDULER_LEADER_KEY
from services.runtime.nats.bus import EventBus
from services.runtime.nats.kv import open_bucket

log = logging.getLogger(__name__)

SURE_FOR = 0.75
"""Of the TTL: how long after its last write (sent) a holder is sure it still holds the lease. Renewals come every
third of it, so a live holder never passes this; one whose process was paused past it (GC, SIGSTOP, a frozen VM) may
have been replaced by a standby, whatever its keeper has seen yet."""


HOLDER = re.compile(r"[A-Za-z0-9._-]+:[0-9a-f]+")
"""What a holder writes (`open`): its host and a number. Anything else in the key is no holder's: written there by
the broker itself on a reply subject an executor's request named (a JetStream answer, an ack), which a lease must
outlive rather than lose to."""


class LeaderLease:
    def __init__(self, kv: KeyValue, holder: str, ttl_s: float, role: str = SCHEDULER_LEADER_KEY) -> None:
        self.kv = kv
        self.holder = holder
        self.ttl_s = ttl_s
        self.role = role
        """The lease's key in the bucket, and what the logs call the holder."""
        self.revision: int | None = None
        self.renewed_at = -math.inf
        """When (monotonic) the last write that holds the lease was sent."""

    @classmethod
    async def open(cls, bus: EventBus, ttl_s: float, role: str = SCHEDULER_LEADER_KEY) -> "LeaderLease":
        holder = f"{socket.gethostname()}:{id(bus):x}"
        return cls(await open_bucket(bus, LEADER_BUCKET, ttl_s), holder, ttl_s, role)

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Wait until this process holds the lease (True) or `stop` is set (False)."""
        standing_by = False
        while not stop.is_set():
            try:
                sent = time.monotonic()
                self.revision = await self.kv.create(self.role, self.holder.encode())
                self.renewed_at = sent
                log.info("%s %s is the leader", self.role, self.holder)
                return True
            except nats.js.errors.KeyWrongLastSequenceError:
                # another process of this role leads; its lease expires unless it renews (a write no holder made
                # expires as it would: the bucket's age limit, one TTL)
                if not standing_by:
                    log.info("%s %s stands by: another one leads", self.role, self.holder)
                    standing_by = True
            except (nats.errors.Error, OSError) as error:
                log.warning("leader lease not reachable: %r", error)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.ttl_s / 4)
        return False

    async def keep(self, stop: asyncio.Event) -> None:
        """Renew the lease until `stop` is set; returns early when the lease is lost."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.ttl_s / 3)
                break
            try:
                sent = time.monotonic()
                try:
                    self.revision = await self.kv.update(self.role, self.holder.encode(), last=self.revision)
                except nats.js.errors.KeyWrongLastSequenceError:
                    if not await self._over_no_holder():
                        raise
                self.renewed_at = sent
            except (nats.js.errors.KeyWrongLastSequenceError, nats.errors.Error, OSError) as error:
                log.error("%s %s lost the leader lease: %r", self.role, self.holder, error)
                return

    async def _over_no_holder(self) -> bool:
        """The holder renewing: write over a key whose last write is no holder's (`HOLDER`), by compare-and-set on
        that write; whether it still holds the lease. A holder's write (a standby that took over) is left as it is."""
        try:
            entry = await self.kv.get(self.role)
        except nats.js.errors.KeyNotFoundError:
            return False
        if entry.value is not None and HOLDER.fullmatch(entry.value.decode(errors="replace")):
            return False
        log.warning("%s %s: the lease key held no holder's write (%r); written over", self.role, self.holder,
                    (entry.value or b"")[:80])
        try:
            self.revision = await self.kv.update(self.role, self.holder.encode(), last=entry.revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            return False
        return True

    def lost(self) -> bool:
        """Whether this holder can no longer be sure it holds the lease (see `SURE_FOR`): it must not act on it."""
        return time.monotonic() - self.renewed_at >= self.ttl_s * SURE_FOR

    async def release(self) -> None:
        with contextlib.suppress(nats.js.errors.KeyWrongLastSequenceError, nats.errors.Error, OSError):
            await self.kv.delete(self.role, last=self.revision)
