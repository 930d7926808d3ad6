"""Read-your-writes for lists: the creates and deletes this gateway answered before the read model showed them, which
the owner's next list waits for the ledger to fold before it reads the owner's index."""

import time
from dataclasses import dataclass, field
from typing import Literal

from services.runtime.nats.readmodel import ReadModel

Write = Literal["batch", "file", "file_deleted"]
KEEP_S = 600.0
"""A write not shown after this long is no longer waited for (a ledger down slows lists once, not forever)."""
MAX_PER_OWNER = 1000
SWEEP_EVERY = 1000
"""Notes between sweeps of every owner's writes older than `KEEP_S` (owners who never list leave nothing behind)."""


@dataclass
class OwnWrites:
    pending: dict[str, dict[tuple[Write, str], float]] = field(default_factory=dict)
    """owner → (what, id) → when it was noted, oldest first."""
    notes: int = 0

    def note(self, owner: str, what: Write, ident: str) -> None:
        now = time.monotonic()
        writes = self.pending.setdefault(owner, {})
        writes.pop((what, ident), None)
        _drop_stale(writes, now)
        if len(writes) >= MAX_PER_OWNER:
            writes.pop(next(iter(writes)))
        writes[(what, ident)] = now
        self.notes += 1
        if self.notes % SWEEP_EVERY == 0:
            for other in list(self.pending):
                if not _drop_stale(self.pending[other], now):
                    del self.pending[other]

    def awaits(self, owner: str, what: Write, ident: str) -> bool:
        """Whether this owner's `what` of `ident` was answered before the read model showed it."""
        return (what, ident) in self.pending.get(owner, {})

    async def settle(self, read_model: ReadModel, owner: str, kinds: tuple[Write, ...], within_s: float) -> None:
        """Wait (up to `within_s` in all) until the read model shows this owner's pending writes of `kinds`."""
        writes = self.pending.get(owner)
        if not writes:
            return
        deadline = time.monotonic() + within_s
        for (what, ident), noted in list(writes.items()):
            if what not in kinds:
                continue
            if time.monotonic() - noted > KEEP_S or await _shown(read_model, what, ident,
                                                                  max(0.0, deadline - time.monotonic())):
                writes.pop((what, ident), None)
        if not writes and self.pending.get(owner) is writes:  # (a sweep may have dropped it, and a note made anew)
            self.pending.pop(owner, None)


async def _shown(read_model: ReadModel, what: Write, ident: str, within_s: float) -> bool:
    if what == "batch":
        return await read_model.wait_for(lambda: read_model.get_batch(ident), lambda _: True, within_s) is not None
    deleting = what == "file_deleted"
    record = await read_model.wait_for(lambda: read_model.get_file(ident), lambda r: r.deleted or not deleting,
                                       within_s)
    return record is not None and (record.deleted or not deleting)


def _drop_stale(writes: dict[tuple[Write, str], float], now: float) -> int:
    """Drop the writes noted more than `KEEP_S` ago (the oldest come first): how many are left."""
    while writes:
        oldest = next(iter(writes))
        if now - writes[oldest] <= KEEP_S:
            break
        del writes[oldest]
    return len(writes)
