"""One read for every request that needs the same thing at once (an owner's index and its decoded records), so a burst
of list pages holds one copy, not one per request. A request is answered only by a read that began after it asked
(it sees everything acknowledged before); requests arriving mid-read share the next one, so at most two reads of a
key exist at once. Not a cache: nothing is kept once a read's requests have their answer."""

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, TypeVar

Result = TypeVar("Result")


@dataclass
class SharedReads:
    waiting: dict[Hashable, "asyncio.Task[Any]"] = field(default_factory=dict)
    """Per key, the read that has not begun yet: a request for the key joins it."""
    latest: dict[Hashable, "asyncio.Task[Any]"] = field(default_factory=dict)
    """Per key, the read made last (running or waiting): the next one begins once it has ended."""
    unfinished: set["asyncio.Task[Any]"] = field(default_factory=set)
    """Every read running or waiting to begin, whatever its key."""

    async def read(self, key: Hashable, read: Callable[[], Awaitable[Result]]) -> Result:
        """`read()`'s answer from a read of `key` begun after this call, shared by the callers of one key."""
        task = self.waiting.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._after(key, self.latest.get(key), read))
            task.add_done_callback(lambda done: self._ended(key, done))
            self.waiting[key] = self.latest[key] = task
            self.unfinished.add(task)
        # One caller going away (a client gone, a cancelled handler) does not stop the read the others wait for.
        result: Result = await asyncio.shield(task)
        return result

    async def _after(self, key: Hashable, previous: "asyncio.Task[Any] | None",
                     read: Callable[[], Awaitable[Result]]) -> Result:
        if previous is not None:
            await asyncio.wait([previous])
        if self.waiting.get(key) is asyncio.current_task():
            del self.waiting[key]  # begun: a request from now on waits for the next read
        return await read()

    def _ended(self, key: Hashable, task: "asyncio.Task[Any]") -> None:
        self.unfinished.discard(task)
        if self.waiting.get(key) is task:  # cancelled before it began
            del self.waiting[key]
        if self.latest.get(key) is task:
            del self.latest[key]
        if not task.cancelled():
            task.exception()  # its callers have it; if all of them went away, it is not an unretrieved error

    def in_flight(self) -> int:
        """Reads running or waiting to begin (0 whenever no request is in flight)."""
        return len(self.unfinished)
