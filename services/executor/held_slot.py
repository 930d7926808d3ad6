"""A slot an executor's line holds, given back to its pool exactly once."""

from typing import Protocol


class Releases(Protocol):
    def release(self, owner: str, index: int | None = None) -> None: ...


class HeldSlot:
    """A slot taken, with its engine index, to give back exactly once, whichever path gets there first: the line's own
    `finally`, or the done callback of a task cancelled before it ever ran (its coroutine's `finally` never runs)."""

    def __init__(self, pool: Releases, owner: str, index: int) -> None:
        self._pool: Releases | None = pool
        self._owner = owner
        self.index = index

    def give_back(self, *_: object) -> None:
        """Release the slot the first time; later calls do nothing (also usable as a done callback)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.release(self._owner, self.index)
