"""One engine's slots, shared by every attempt running on it and fair between batch owners: a freed slot goes to
the waiting owner holding the fewest, first come first served among equals; an attempt alone may take them all."""

import asyncio
import itertools
from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True, eq=False)
class _Waiter:
    arrival: int
    owner: str
    granted: asyncio.Future[None]


class SlotPool:
    """`size` slots; `acquire(owner)` waits for one, `release(owner)` gives it back. Cancellation-safe: a waiter
    cancelled before or as its slot is granted holds none."""

    def __init__(self, size: int) -> None:
        self.size = max(size, 1)
        self.held: Counter[str] = Counter()
        """Slots in use, by owner."""
        self._waiting: list[_Waiter] = []
        self._arrivals = itertools.count()

    @property
    def free(self) -> int:
        return self.size - self.held.total()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def acquire(self, owner: str) -> None:
        waiter = _Waiter(next(self._arrivals), owner, asyncio.get_running_loop().create_future())
        self._waiting.append(waiter)
        self._grant()  # a free slot is taken at once (no one ready waits while one is free)
        try:
            await waiter.granted
        except asyncio.CancelledError:
            if waiter.granted.done() and not waiter.granted.cancelled():
                self.release(owner)  # granted as it was cancelled: the slot goes to the next in line
            elif waiter in self._waiting:
                self._waiting.remove(waiter)
            raise

    def release(self, owner: str) -> None:
        if self.held[owner] <= 0:
            raise RuntimeError(f"{owner} releases a slot it does not hold")
        self.held[owner] -= 1
        if not self.held[owner]:
            del self.held[owner]
        self._grant()

    async def take(self, owner: str, stopping: asyncio.Event) -> bool:
        """Wait for a slot; False (holding none) once `stopping` is set: an attempt that must stop starts no line."""
        if stopping.is_set():
            return False
        acquiring = asyncio.ensure_future(self.acquire(owner))
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
            return False
        acquiring.result()
        return True

    def held_by(self, owner: str) -> "HeldSlot":
        """The slot `owner` just took, to give back exactly once (`HeldSlot.give_back`), whichever path gets there
        first: the line's own `finally`, or the done callback of a task cancelled before it ever ran (its
        coroutine's `finally` never runs then)."""
        return HeldSlot(self, owner)

    def _abandon(self, acquiring: "asyncio.Future[None]", owner: str) -> None:
        """Give up an acquire: a slot it got goes back; one still waiting is withdrawn (it releases what it is
        granted meanwhile)."""
        if not acquiring.done():
            acquiring.cancel()
        elif not acquiring.cancelled() and acquiring.exception() is None:
            self.release(owner)

    def _grant(self) -> None:
        # A waiter cancelled but not yet resumed is still listed: it is skipped, and removes itself.
        while self.free > 0 and (ready := [waiter for waiter in self._waiting if not waiter.granted.done()]):
            # Fewest slots held first; among equals, the earliest to ask.
            chosen = min(ready, key=lambda waiter: (self.held[waiter.owner], waiter.arrival))
            self._waiting.remove(chosen)
            self.held[chosen.owner] += 1
            chosen.granted.set_result(None)


class HeldSlot:
    def __init__(self, pool: SlotPool, owner: str) -> None:
        self._pool: SlotPool | None = pool
        self._owner = owner

    def give_back(self, *_: object) -> None:
        """Release the slot the first time; later calls do nothing (also usable as a done callback)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.release(self._owner)
