"""Locks by key (an owner's), each kept only while a task holds or awaits it: a process that meets many keys over its
life keeps none that nobody uses."""

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field


@dataclass
class _Lock:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0
    """Tasks holding or awaiting the lock; it goes when none is left."""


class KeyedLocks:
    """One lock per key: tasks that hold the same key run one at a time, others at once."""

    def __init__(self) -> None:
        self._locks: dict[str, _Lock] = {}

    def __len__(self) -> int:
        """Keys whose lock is held or awaited now."""
        return len(self._locks)

    @asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        entry = self._locks.get(key) or self._locks.setdefault(key, _Lock())
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:  # also for a task cancelled while it waited
            entry.users -= 1
            if not entry.users:
                del self._locks[key]
