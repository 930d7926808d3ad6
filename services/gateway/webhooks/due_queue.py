"""The webhook deliveries due, as each gateway keeps them: a watch on the bucket's due entries, each owner's in a heap
by when it is next due. A poll looks at the oldest few of each owner with something due (round robin, owners in the
order of their oldest) and never reads, decodes or sorts every tenant's deliveries. A claim is still decided by the
bucket (compare-and-set): what the queue offers may have been taken or finished by another gateway meanwhile (an
erased entry leaves no trace a watch sees, so the queue forgets one when a claim finds it gone)."""

import asyncio
import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import chain, zip_longest

from nats.js.kv import KeyValue

from services.gateway.webhooks.store import DUE, Claim, Due
from services.runtime.nats.kv_watch import decoded, keep

LOOKED_AT_PER_OWNER = 32
"""Due deliveries of one owner a poll looks at, at most (oldest first): an owner with a backlog behind a broken
endpoint costs every poll this much, never its whole backlog."""
SLACK = 64
"""Stale heap items (changed or gone entries) tolerated beyond the live ones before an owner's heap is rebuilt."""


@dataclass
class DueQueue:
    owner_of: Callable[[str], str]
    """An endpoint's owner (the endpoint itself when unknown: a deleted one)."""
    entries: dict[str, tuple[float, str, str]] = field(default_factory=dict)
    """Delivery id → when it is next due, its endpoint and its owner."""
    heaps: dict[str, list[tuple[float, str]]] = field(default_factory=dict)
    """Owner → (when due, delivery id), possibly stale: an item counts while it matches `entries`."""
    live: dict[str, int] = field(default_factory=dict)
    """Owner → entries of theirs."""
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    def set(self, delivery_id: str, due: Due | None) -> None:
        """The delivery's due entry as written now (None: gone)."""
        self.forget(delivery_id)
        if due is None:
            return
        owner = self.owner_of(due.endpoint_id)
        self.entries[delivery_id] = (due.not_before, due.endpoint_id, owner)
        self.live[owner] = self.live.get(owner, 0) + 1
        heap = self.heaps.setdefault(owner, [])
        heapq.heappush(heap, (due.not_before, delivery_id))
        if len(heap) > 2 * self.live[owner] + SLACK:
            self.heaps[owner] = [item for item in heap if self._holds(owner, item)]
            heapq.heapify(self.heaps[owner])

    def forget(self, delivery_id: str) -> None:
        old = self.entries.pop(delivery_id, None)
        if old is None:
            return
        owner = old[2]
        self.live[owner] -= 1
        if self.live[owner] <= 0:
            del self.live[owner]
            self.heaps.pop(owner, None)

    def _holds(self, owner: str, item: tuple[float, str]) -> bool:
        entry = self.entries.get(item[1])
        return entry is not None and entry[0] == item[0] and entry[2] == owner

    def offered(self, now: float) -> list[tuple[Claim, str]]:
        """The deliveries due at `now` with their owners, round robin across owners (each owner's oldest first, at
        most `LOOKED_AT_PER_OWNER` each; owners in the order of their oldest)."""
        fronts: list[tuple[float, list[tuple[Claim, str]]]] = []
        for owner, heap in self.heaps.items():
            taken: list[tuple[float, str]] = []
            while heap and len(taken) < LOOKED_AT_PER_OWNER and heap[0][0] <= now:
                item = heapq.heappop(heap)
                if self._holds(owner, item):
                    taken.append(item)
            for item in taken:  # offered, not taken: a claim moves an entry on, and the watch brings it back
                heapq.heappush(heap, item)
            if taken:
                fronts.append((taken[0][0], [(Claim(delivery_id, self.entries[delivery_id][1]), owner)
                                             for _, delivery_id in taken]))
        fronts.sort(key=lambda front: front[0])
        rounds = zip_longest(*(offers for _, offers in fronts))
        return [offer for offer in chain.from_iterable(rounds) if offer is not None]

    def restart(self) -> None:
        self.entries.clear()  # the watch shows every current entry again
        self.heaps.clear()
        self.live.clear()

    def put(self, key: str, value: bytes | None, revision: int) -> None:
        self.set(key.removeprefix(f"{DUE}."), decoded(Due, key, value, "a due webhook delivery"))

    def current(self) -> None:
        self.ready.set()

    def lost(self) -> None:
        self.ready.clear()

    async def follow(self, kv: KeyValue, ready_first: asyncio.Event) -> None:
        """Keep the queue as the bucket's due entries change, until cancelled (once `ready_first` is set: the
        owners are known); a broken watch is made again, the queue rebuilt from what it shows."""
        await ready_first.wait()
        await keep(kv, f"{DUE}.*", self, "the due webhook deliveries")
