"""One engine's slots, shared by every attempt running on it and fair between batch owners: a freed slot goes to
the waiting owner holding the fewest, first come first served among equals; an attempt alone may take them all.

Slots are numbered as the engine numbers them. A line given a prefix key (services/executor/prefixes.py) is handed
the slot that holds its prefix where it can be (among waiters of owners holding as many, those a free slot already
holds warm go first), so the engine's per-slot prompt cache serves the shared part; a unit's planned lines
(`SlotPool.unit`) tell the pool which prefixes are still to come, so their slots are not given away meanwhile.
"""

import asyncio
import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

from services.executor.prefixes import SlotView, choose_slot, order_lines


@dataclass(eq=False)
class _Slot:
    index: int
    resident: str | None = None
    """Prefix key of the last line started here: what the engine's KV cache of this slot holds."""
    busy: bool = False
    last_used: int = -1


@dataclass(frozen=True, eq=False)
class _Waiter:
    arrival: int
    owner: str
    prefix: str | None
    unit: "UnitPlan | None"
    granted: asyncio.Future[int]


class SlotPool:
    """`size` slots; `acquire(owner)` waits for one, `release(owner)` gives it back. Cancellation-safe: a waiter
    cancelled before or as its slot is granted holds none."""

    def __init__(self, size: int) -> None:
        self.size = max(size, 1)
        self.held: Counter[str] = Counter()
        """Slots in use, by owner."""
        self._slots = [_Slot(index) for index in range(self.size)]
        self._held_slots: dict[str, list[int]] = {}
        self._waiting: list[_Waiter] = []
        self._arrivals = itertools.count()
        self._uses = itertools.count()
        self._last: dict[str, HeldSlot] = {}
        self._units: list[UnitPlan] = []
        """Units planned and not yet closed."""

    @property
    def free(self) -> int:
        return self.size - self.held.total()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def resident(self) -> set[str]:
        """Prefix keys some slot holds."""
        return {slot.resident for slot in self._slots if slot.resident is not None}

    def unit(self, keys: Sequence[str | None]) -> "UnitPlan":
        """Plan a unit's lines (their prefix keys, in file order): the order to start them, and, until the plan is
        closed, the pool keeps in mind the prefixes still to come."""
        return UnitPlan(self, keys)

    async def acquire(self, owner: str, prefix: str | None = None, unit: "UnitPlan | None" = None) -> int:
        """Wait for a slot; its index."""
        waiter = _Waiter(next(self._arrivals), owner, prefix, unit, asyncio.get_running_loop().create_future())
        self._waiting.append(waiter)
        self._grant()  # a free slot is taken at once (no one ready waits while one it may take is free)
        try:
            index = await waiter.granted
        except asyncio.CancelledError:
            if waiter.granted.done() and not waiter.granted.cancelled():
                self.release(owner, waiter.granted.result())  # granted as it was cancelled: it goes to the next
            elif waiter in self._waiting:
                self._waiting.remove(waiter)
                self._grant()  # a waiter behind may take what this one was waiting for
            raise
        self._last[owner] = HeldSlot(self, owner, index)
        return index

    def release(self, owner: str, index: int | None = None) -> None:
        """Give back `owner`'s slot `index` (by default the earliest it still holds)."""
        held = self._held_slots.get(owner, [])
        if not held or (index is not None and index not in held):
            raise RuntimeError(f"{owner} releases a slot it does not hold")
        index = held[0] if index is None else index
        held.remove(index)
        if not held:
            del self._held_slots[owner]
        self.held[owner] -= 1
        if not self.held[owner]:
            del self.held[owner]
        self._slots[index].busy = False
        self._grant()

    async def take(self, owner: str, stopping: asyncio.Event, prefix: str | None = None,
                   unit: "UnitPlan | None" = None) -> "HeldSlot | None":
        """Wait for a slot; None (holding none) once `stopping` is set: an attempt that must stop starts no line."""
        if stopping.is_set():
            return None
        acquiring = asyncio.ensure_future(self.acquire(owner, prefix, unit))
        waiting = asyncio.ensure_future(stopping.wait())
        try:
            await asyncio.wait({acquiring, waiting}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            self._abandon(acquiring, owner)
            raise
        finally:
            waiting.cancel()
        if stopping.is_set():
            self._abandon(acquiring, owner)
            return None
        held = self._last[owner] = HeldSlot(self, owner, acquiring.result())
        return held

    def held_by(self, owner: str) -> "HeldSlot":
        """The slot `owner` just took, to give back exactly once (`HeldSlot.give_back`), whichever path gets there
        first: the line's own `finally`, or the done callback of a task cancelled before it ever ran (its
        coroutine's `finally` never runs then)."""
        return self._last[owner]

    def _abandon(self, acquiring: "asyncio.Future[int]", owner: str) -> None:
        """Give up an acquire: a slot it got goes back; one still waiting is withdrawn (it releases what it is
        granted meanwhile)."""
        if not acquiring.done():
            acquiring.cancel()
        elif not acquiring.cancelled() and acquiring.exception() is None:
            self.release(owner, acquiring.result())

    def _need(self) -> dict[str, int]:
        """How many slots each planned prefix can still use: its lanes, at most its lines not yet started (those
        waiting included)."""
        lanes: Counter[str] = Counter()
        to_come: Counter[str] = Counter()
        for unit in self._units:
            for key, count in unit.to_come.items():
                if count > 0:
                    # Units planning the same prefix share its lanes: lines of both take turns on its slots.
                    lanes[key] = max(lanes[key], unit.lanes[key])
                    to_come[key] += count
        return {key: min(lanes[key], to_come[key]) for key in lanes}

    def _grant(self) -> None:
        # A waiter cancelled but not yet resumed is still listed: it is skipped, and removes itself.
        while self.free > 0:
            ready = [waiter for waiter in self._waiting if not waiter.granted.done()]
            if not ready:
                return
            need = self._need()
            views = [SlotView(slot.index, slot.resident, slot.busy, slot.last_used) for slot in self._slots]
            warm = {slot.resident for slot in self._slots if not slot.busy and slot.resident is not None}
            # Fewest slots held first; among equals, one a free slot holds warm, then the earliest to ask.
            ready.sort(key=lambda waiter: (self.held[waiter.owner], waiter.prefix not in warm, waiter.arrival))
            for waiter in ready:
                index = choose_slot(waiter.prefix if waiter.unit is not None else None, views, need)
                if index is not None:
                    break
            else:
                return  # every waiter waits for a busy slot holding its prefix
            self._hand(waiter, index)

    def _hand(self, waiter: _Waiter, index: int) -> None:
        self._waiting.remove(waiter)
        slot = self._slots[index]
        slot.busy, slot.resident, slot.last_used = True, waiter.prefix, next(self._uses)
        self.held[waiter.owner] += 1
        self._held_slots.setdefault(waiter.owner, []).append(index)
        if waiter.unit is not None:
            waiter.unit.started(waiter.prefix)
        waiter.granted.set_result(index)


class UnitPlan:
    """A unit's lines as the pool runs them: `order` (indices into the unit's lines) to start them in, `take(i)` to
    wait for line i's slot. Open until closed (a `with` block): the prefixes of its lines not yet started count as
    still to come."""

    def __init__(self, pool: SlotPool, keys: Sequence[str | None]) -> None:
        self._pool = pool
        self.keys = list(keys)
        planned = order_lines(self.keys, pool.size, pool.resident)
        self.order = planned.order
        self.lanes = planned.lanes
        self.to_come = Counter(key for key in self.keys if key is not None)
        """Lines not yet started, by prefix key."""
        self._open = True
        pool._units.append(self)

    async def take(self, owner: str, index: int, stopping: asyncio.Event) -> "HeldSlot | None":
        """The slot line `index` should start on, once one is; None (holding none) once `stopping` is set."""
        return await self._pool.take(owner, stopping, self.keys[index], self if self._open else None)

    def started(self, key: str | None) -> None:
        if key is not None and self.to_come[key] > 0:
            self.to_come[key] -= 1

    def close(self) -> None:
        if self._open:
            self._open = False
            self._pool._units.remove(self)
            self._pool._grant()  # a waiter kept waiting for this unit's prefixes may now take a slot

    def __enter__(self) -> "UnitPlan":
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()


class HeldSlot:
    """A slot taken, with its engine index, to give back exactly once."""

    def __init__(self, pool: SlotPool, owner: str, index: int) -> None:
        self._pool: SlotPool | None = pool
        self._owner = owner
        self.index = index

    def give_back(self, *_: object) -> None:
        """Release the slot the first time; later calls do nothing (also usable as a done callback)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.release(self._owner, self.index)
