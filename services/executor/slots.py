"""One engine's slots, shared fairly between batch owners: a freed slot goes to the waiting owner holding the fewest,
then the one that started fewest lines, then first come (kept a moment for an owner's unit between two asks); among
one owner's, to the batch with the fewest lines left to start, so its batches end one after another rather than all
late together (one passed over `PASSED_OVER_LIMIT` times goes first: none waits for ever). A free slot starts a line
whose prompt prefix it holds (prefixes.py), so the per-slot prompt cache serves the shared part."""

import asyncio
import heapq
import itertools
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType

from services.executor.held_slot import HeldSlot
from services.executor.prefixes import SlotState, choose_start, order_lines

PASSED_OVER_LIMIT = 8
"""Times a waiter may be passed over by its owner's later waiters (their batches nearer their end) before it goes
first among its owner's: a batch is never held back for ever by the owner's stream of smaller ones."""
BATCHES_KEPT = 4096
"""Recent batches whose first plan's place is remembered (far more than an executor runs at once)."""
Grant = tuple[int, int | None]
"""(the slot's engine index, the unit's line started on it, or None for a slot taken without a unit)."""


@dataclass(eq=False, slots=True)
class _Waiter:
    arrival: int
    owner: str
    unit: "UnitPlan | None"
    granted: asyncio.Future[Grant]
    passed: int = 0
    """Grants its owner's later waiters took while it waited (past `PASSED_OVER_LIMIT` it goes first)."""

    def candidates(self) -> list[str | None]:
        return self.unit.candidates() if self.unit is not None else [None]


class SlotPool:
    """`size` slots, held by owner. Cancellation-safe: a waiter cancelled as its slot is granted holds none."""

    def __init__(self, size: int) -> None:
        self.size = max(size, 1)
        self.held: Counter[str] = Counter()
        """Slots in use, by owner."""
        self._slots = [SlotState(index) for index in range(self.size)]
        self._resident_slots = 0
        """Slots holding a prefix key: while none does, every choice is the least recently used free slot."""
        self._free_order: list[tuple[int, int]] = [(slot.last_used, slot.index) for slot in self._slots]
        """A heap of (last used, index) of the free slots (entries of slots taken since are skipped when met)."""
        self._held_slots: dict[str, list[int]] = {}
        self._waiting: list[_Waiter] = []
        self._arrivals = itertools.count()
        self._uses = itertools.count()
        self._units: list[UnitPlan] = []
        """Units planned and not yet closed."""
        self._served: dict[str, int] = {}
        """Lines each owner present started here (a newcomer starts level with the least served holder)."""
        self._batch_arrivals: OrderedDict[str, int] = OrderedDict()
        """When each recent batch's first unit was planned: its later plans keep its place among its owner's."""

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

    def unit(self, keys: Sequence[str | None], batch: str | None = None, beyond: int = 0) -> "UnitPlan":
        """Plan a unit's lines (their prefix keys, in file order), started by `UnitPlan.next` until it is closed;
        `batch`: whose (the units of one batch take turns; another batch's wait or go by its lines left); `beyond`:
        the unit's lines still to come after these (planned later)."""
        return UnitPlan(self, keys, batch, beyond)

    def _arrival_of(self, batch: str | None) -> int:
        """A plan's place among its owner's: its batch's first plan's (recent batches kept), else its own."""
        if batch is None:
            return next(self._arrivals)
        arrival = self._batch_arrivals.setdefault(batch, next(self._arrivals))
        self._batch_arrivals.move_to_end(batch)
        if len(self._batch_arrivals) > BATCHES_KEPT:
            self._batch_arrivals.popitem(last=False)
        return arrival

    async def acquire(self, owner: str, unit: "UnitPlan | None" = None) -> Grant:
        """Wait for a slot (and, for a unit, the line to start on it)."""
        return await self._granted(self._enqueue(owner, unit))

    def _enqueue(self, owner: str, unit: "UnitPlan | None") -> _Waiter:
        waiter = _Waiter(next(self._arrivals), owner, unit, asyncio.get_running_loop().create_future())
        self._waiting.append(waiter)
        self._grant()  # a free slot is taken at once (no one ready waits while one it may take is free)
        return waiter

    async def _granted(self, waiter: _Waiter) -> Grant:
        try:
            return await waiter.granted
        except asyncio.CancelledError:
            if waiter.granted.done() and not waiter.granted.cancelled():  # granted as it was cancelled: undone
                self._undo(waiter.owner, waiter.unit, waiter.granted.result())
            elif waiter in self._waiting:
                self._waiting.remove(waiter)
                self._grant()  # a waiter behind may take what this one was waiting for
            raise

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
            if not any(waiter.owner == owner for waiter in self._waiting) and not any(
                    unit.owner == owner and unit.has_lines_to_start for unit in self._units):
                self._served.pop(owner, None)  # gone: it comes back level with the least served
        slot = self._slots[index]
        slot.busy = False
        if len(self._free_order) > 2 * self.size:  # entries of slots taken by a keyed choice: start afresh
            self._free_order = [(free.last_used, free.index) for free in self._slots if not free.busy]
            heapq.heapify(self._free_order)
        else:
            heapq.heappush(self._free_order, (slot.last_used, index))
        self._grant()

    async def take(self, owner: str, stopping: asyncio.Event) -> HeldSlot | None:
        """Wait for a slot; None (holding none) once `stopping` is set: an attempt that must stop starts no line."""
        taken = await self._take(owner, stopping, None)
        return None if taken is None else taken[1]

    async def _take(self, owner: str, stopping: asyncio.Event,
                    unit: "UnitPlan | None") -> tuple[int | None, HeldSlot] | None:
        if stopping.is_set():
            return None
        waiter = self._enqueue(owner, unit)
        if waiter.granted.done():  # taken at once: no task waits for it (most lines, while slots are free)
            index, line = waiter.granted.result()
            return line, HeldSlot(self, owner, index)
        acquiring = asyncio.ensure_future(self._granted(waiter))
        waiting = asyncio.ensure_future(stopping.wait())
        try:
            await asyncio.wait({acquiring, waiting}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            self._abandon(acquiring, owner, unit)
            raise
        finally:
            waiting.cancel()
        if stopping.is_set():
            self._abandon(acquiring, owner, unit)
            return None
        index, line = acquiring.result()
        return line, HeldSlot(self, owner, index)

    def _abandon(self, acquiring: "asyncio.Future[Grant]", owner: str, unit: "UnitPlan | None") -> None:
        """Give up an acquire: a slot it got goes back; one still waiting is withdrawn."""
        if not acquiring.done():
            acquiring.cancel()
        elif not acquiring.cancelled() and acquiring.exception() is None:
            self._undo(owner, unit, acquiring.result())

    def _undo(self, owner: str, unit: "UnitPlan | None", grant: Grant) -> None:
        """A grant nobody will use: its line is the unit's again, its slot goes back."""
        if unit is not None and grant[1] is not None:
            unit.unclaim(grant[1])
        self.release(owner, grant[0])

    def _need(self) -> dict[str, int]:
        """How many slots each planned prefix can still use: its lanes, at most its lines not yet started."""
        lanes: Counter[str] = Counter()
        to_come: Counter[str] = Counter()
        for unit in self._units:
            for key, count in unit.to_come.items():
                if count > 0:
                    # Units planning the same prefix share its lanes: lines of both take turns on its slots.
                    lanes[key] = max(lanes[key], unit.lanes[key])
                    to_come[key] += count
        return {key: min(lanes[key], to_come[key]) for key in lanes}

    def _turns(self) -> Callable[[_Waiter], tuple[int, int, int]]:
        """A waiter's place among its owner's: the batch with the fewest lines left to start here first (it ends
        soonest; a small batch is not queued behind its owner's large one, and an owner's batches end one after
        another rather than all late together), then the batch that came first, then the waiter that asked first
        (the units of one batch take turns)."""
        batches: dict[str, tuple[int, int]] = {}
        for unit in self._units:
            if unit.batch is not None:
                left, first = batches.get(unit.batch, (0, unit.serial))
                batches[unit.batch] = left + unit.lines_to_start, min(first, unit.serial)

        def turn(waiter: _Waiter) -> tuple[int, int, int]:
            unit = waiter.unit
            if waiter.passed >= PASSED_OVER_LIMIT:
                return -1, waiter.arrival, waiter.arrival
            if unit is None:
                return 1, waiter.arrival, waiter.arrival
            left, first = batches[unit.batch] if unit.batch is not None else (unit.lines_to_start, unit.serial)
            return left, first, waiter.arrival
        return turn

    def _returning(self, ready: list[_Waiter]) -> set[str]:
        """Owners of open units with lines still to start and no waiter now (a unit asks again a moment after a grant):
        slots freed together would otherwise all go to owners with several units waiting."""
        asking = {waiter.owner for waiter in ready}
        return {unit.owner for unit in self._units
                if unit.owner is not None and unit.owner not in asking and unit.has_lines_to_start}

    def _alone(self, waiter: _Waiter) -> bool:
        """Whether `waiter` is ready and no other owner has a unit with lines to start (none is kept a slot)."""
        return not waiter.granted.done() and bool(waiter.candidates()) and not any(
            unit.owner is not None and unit.owner != waiter.owner and unit.has_lines_to_start for unit in self._units)

    def _grant(self) -> None:
        # A waiter cancelled but not yet resumed is still listed: it is skipped, and removes itself.
        if not self._waiting:
            return  # no one to hand a slot to (most releases, while slots are free)
        baseline = min((self._served[owner] for owner in self.held if owner in self._served), default=0)
        for waiter in self._waiting:
            if waiter.owner not in self._served:
                self._served[waiter.owner] = baseline  # a newcomer starts level with the least served holder
        budget = self.free
        if budget <= 0:
            return  # every slot is busy (most asks, while lines wait)
        if len(self._waiting) == 1 and not self._resident_slots and self._alone(self._waiting[0]):
            # One waiter, no prefix held, no other owner to keep a slot for: it takes the least recently used.
            waiter = self._waiting[0]
            self._hand(waiter, self._least_recently_used(), waiter.candidates()[0])
            return
        held, served = dict(self.held), dict(self._served)
        """Slots held and lines started, counting the slots left free this round for returning owners."""

        def standing(owner: str) -> tuple[int, int]:
            return held.get(owner, 0), served.get(owner, baseline)

        while budget > 0:
            ready = [waiter for waiter in self._waiting if not waiter.granted.done() and waiter.candidates()]
            if not ready:
                return
            returning = min(self._returning(ready), default=None, key=standing)
            if returning is not None and standing(returning) < min(standing(waiter.owner) for waiter in ready):
                held[returning] = held.get(returning, 0) + 1  # its slot stays free until its unit asks again
                served[returning] = served.get(returning, baseline) + 1
                budget -= 1
                continue
            chosen = self._choose(ready, standing)
            if chosen is None:
                return  # every waiter waits for a busy slot holding one of its prefixes
            waiter, choice = chosen
            self._hand(waiter, *choice)
            held[waiter.owner] = held.get(waiter.owner, 0) + 1
            served[waiter.owner] = served.get(waiter.owner, baseline) + 1
            budget -= 1

    def _choose(self, ready: list[_Waiter], standing: Callable[[str], tuple[int, int]]
                ) -> tuple[_Waiter, tuple[int, str | None]] | None:
        """The waiter to hand a free slot now, with which slot and prefix; None: all wait. Fewest slots held first, then
        fewest lines started (first come would favour the owner that just gave one back), then warm, then the owner's
        batch nearest its end (`_turns`)."""
        if not self._resident_slots:
            # No slot is warm: the first waiter starts its first candidate on the least recently used free slot (as
            # `choose_start` would, without reading every slot).
            turn = self._turns()
            first = min(ready, key=lambda waiter: (*standing(waiter.owner), *turn(waiter)))
            return first, (self._least_recently_used(), first.candidates()[0])
        warm = {slot.resident for slot in self._slots if not slot.busy and slot.resident is not None}
        turn = self._turns()
        ready.sort(key=lambda waiter: (*standing(waiter.owner), warm.isdisjoint(waiter.candidates()), *turn(waiter)))
        need = self._need()
        # An owner below its share while others hold or want slots does not wait for a warm one: the slots it
        # passes over would go to them.
        owners = set(self.held) | {waiter.owner for waiter in ready}
        share = self.size // len(owners) if len(owners) > 1 else 0
        for waiter in ready:
            choice = choose_start(waiter.candidates(), self._slots, need, patient=self.held[waiter.owner] >= share)
            if choice is not None:
                return waiter, choice
        return None

    def _least_recently_used(self) -> int:
        """The free slot used longest ago (never used first, then by index), as `choose_start` ranks them."""
        while True:
            last_used, index = self._free_order[0]
            slot = self._slots[index]
            if not slot.busy and slot.last_used == last_used:
                return index
            heapq.heappop(self._free_order)  # taken since it was freed

    def _hand(self, waiter: _Waiter, index: int, key: str | None) -> None:
        self._waiting.remove(waiter)
        for other in self._waiting:
            if other.owner == waiter.owner and other.arrival < waiter.arrival:
                other.passed += 1
        slot = self._slots[index]
        self._resident_slots += (key is not None) - (slot.resident is not None)
        slot.busy, slot.resident, slot.last_used = True, key, next(self._uses)
        self.held[waiter.owner] += 1
        self._served[waiter.owner] = self._served.get(waiter.owner, 0) + 1
        self._held_slots.setdefault(waiter.owner, []).append(index)
        line = waiter.unit.claim(key) if waiter.unit is not None else None
        waiter.granted.set_result((index, line))


class UnitPlan:
    """A unit's lines as the pool starts them: first those whose prefix a free slot holds; open until closed."""

    def __init__(self, pool: SlotPool, keys: Sequence[str | None], batch: str | None = None, beyond: int = 0) -> None:
        self._pool = pool
        self.batch = batch
        self.beyond = max(beyond, 0)
        """Lines of the unit still to come after these (its next plans)."""
        self.serial = pool._arrival_of(batch)
        self.keys = list(keys)
        planned = order_lines(self.keys, pool.size, pool.resident)
        self.order = planned.order
        self.lanes = planned.lanes
        self._pending = deque(self.order)
        self.to_come = Counter(key for key in self.keys if key is not None)
        """Lines not yet started, by prefix key."""
        self._keyed = bool(self.to_come)
        """Whether any line has a prefix key (if none has, its candidates are None alone while lines are pending)."""
        self._open = True
        self._asking = False
        self.owner: str | None = None
        """Whose lines these are (known from the first `next`)."""
        pool._units.append(self)

    @property
    def has_lines_to_start(self) -> bool:
        return self._open and bool(self._pending)

    @property
    def lines_to_start(self) -> int:
        """Its lines not started yet, these planned and those to come."""
        return len(self._pending) + self.beyond

    async def next(self, owner: str, stopping: asyncio.Event) -> tuple[int, HeldSlot] | None:
        """(the line to start, its slot); None (holding none) once all started, the plan closed or `stopping` set."""
        if not self._pending or not self._open:
            return None
        if self._asking:
            raise RuntimeError("a unit waits for one slot at a time")
        self._asking, self.owner = True, owner
        try:
            taken = await self._pool._take(owner, stopping, self)
        finally:
            self._asking = False
        if taken is None:
            return None
        line, slot = taken
        assert line is not None  # a unit's grant always names its line
        return line, slot

    def candidates(self) -> list[str | None]:
        """The prefix keys of the lines not yet started, in the order they are preferred."""
        if not self._keyed:
            return [None] if self._pending else []
        return list(dict.fromkeys(self.keys[index] for index in self._pending))

    def claim(self, key: str | None) -> int | None:
        """Take the first line not yet started whose prefix key is `key`."""
        for position, index in enumerate(self._pending):
            if self.keys[index] == key:
                del self._pending[position]
                if key is not None:
                    self.to_come[key] -= 1
                return index
        return None

    def unclaim(self, index: int) -> None:
        """A line claimed but not started after all: first in line again."""
        self._pending.appendleft(index)
        key = self.keys[index]
        if key is not None:
            self.to_come[key] += 1

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

