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
"""Due deliveries of one owner a poll offers, at most (its endpoints round robin, each one's oldest first): an owner
with a backlog behind a broken endpoint costs every poll this much, never its whole backlog."""
LOOKED_AT_PER_ENDPOINT = 8
"""Due deliveries of one endpoint a poll looks at, at most: a backlog at one endpoint (its breaker open) never keeps
the same owner's other endpoints from being offered."""
SLACK = 64
"""Stale heap items (changed or gone entries) tolerated beyond the live ones before an owner's heap is rebuilt."""


@dataclass
class DueQueue:
    owner_of: Callable[[str], str]
    """An endpoint's owner (the endpoint itself when unknown: a deleted one)."""
    entries: dict[str, tuple[float, str, str]] = field(default_factory=dict)
    """Delivery id → when it is next due, its endpoint and its owner."""
    heaps: dict[str, dict[str, list[tuple[float, str]]]] = field(default_factory=dict)
    """Owner → endpoint → (when due, delivery id), possibly stale: an item counts while it matches `entries`."""
    live: dict[tuple[str, str], int] = field(default_factory=dict)
    """(Owner, endpoint) → entries of theirs."""
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    def set(self, delivery_id: str, due: Due | None) -> None:
        """The delivery's due entry as written now (None: gone)."""
        self.forget(delivery_id)
        if due is None:
            return
        owner, endpoint_id = self.owner_of(due.endpoint_id), due.endpoint_id
        self.entries[delivery_id] = (due.not_before, endpoint_id, owner)
        live = self.live[owner, endpoint_id] = self.live.get((owner, endpoint_id), 0) + 1
        heaps = self.heaps.setdefault(owner, {})
        heap = heaps.setdefault(endpoint_id, [])
        heapq.heappush(heap, (due.not_before, delivery_id))
        if len(heap) > 2 * live + SLACK:
            heaps[endpoint_id] = [item for item in heap if self._holds(owner, endpoint_id, item)]
            heapq.heapify(heaps[endpoint_id])

    def forget(self, delivery_id: str) -> None:
        old = self.entries.pop(delivery_id, None)
        if old is None:
            return
        group = old[2], old[1]
        self.live[group] -= 1
        if self.live[group] <= 0:
            del self.live[group]
            heaps = self.heaps.get(old[2], {})
            heaps.pop(old[1], None)
            if not heaps:
                self.heaps.pop(old[2], None)

    def _holds(self, owner: str, endpoint_id: str, item: tuple[float, str]) -> bool:
        entry = self.entries.get(item[1])
        return entry is not None and entry[0] == item[0] and entry[2] == owner and entry[1] == endpoint_id

    def offered(self, now: float) -> list[tuple[Claim, str]]:
        """The deliveries due at `now` with their owners, round robin across owners (each owner's endpoints round robin,
        each endpoint's oldest first, at most `LOOKED_AT_PER_ENDPOINT` of an endpoint and `LOOKED_AT_PER_OWNER` of an
        owner; owners and an owner's endpoints in the order of their oldest)."""
        fronts: list[tuple[float, list[tuple[Claim, str]]]] = []
        for owner, heaps in self.heaps.items():
            ends: list[tuple[float, list[tuple[Claim, str]]]] = []
            for endpoint_id, heap in heaps.items():
                taken: list[tuple[float, str]] = []
                while heap and len(taken) < LOOKED_AT_PER_ENDPOINT and heap[0][0] <= now:
                    item = heapq.heappop(heap)
                    if self._holds(owner, endpoint_id, item):
                        taken.append(item)
                for item in taken:  # offered, not taken: a claim moves an entry on, and the watch brings it back
                    heapq.heappush(heap, item)
                if taken:
                    ends.append((taken[0][0], [(Claim(delivery_id, endpoint_id), owner) for _, delivery_id in taken]))
            if ends:
                ends.sort(key=lambda end: end[0])
                rounds = zip_longest(*(offers for _, offers in ends))
                mine = [offer for offer in chain.from_iterable(rounds) if offer is not None][:LOOKED_AT_PER_OWNER]
                fronts.append((ends[0][0], mine))
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
