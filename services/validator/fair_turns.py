"""Whose batch the validator checks next: at most `at_once` at a time and one per owner, owners taking turns in the
order they came, each owner's batches first come first served. One tenant's queue of large files (or of batches it
creates and cancels at once) then holds up another tenant's batch by one validation at most, not by all of its own."""

import asyncio
import contextlib
from collections import OrderedDict, deque
from collections.abc import AsyncIterator


class FairTurns:
    def __init__(self, at_once: int) -> None:
        self.at_once = max(at_once, 1)
        self.running: set[str] = set()
        """Owners with a validation under way (one each)."""
        self._queues: dict[str, deque[asyncio.Future[None]]] = {}
        """Each owner's waiters, first come first."""
        self._line: OrderedDict[str, None] = OrderedDict()
        """Owners waiting and not running, in turn order: one whose validation ends goes to the back."""

    def waiting(self) -> int:
        return sum(len(queue) for queue in self._queues.values())

    @contextlib.asynccontextmanager
    async def turn(self, owner: str) -> AsyncIterator[None]:
        """Wait for the owner's turn, and hold it until the block ends (however it ends)."""
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queues.setdefault(owner, deque()).append(granted)
        if owner not in self.running:
            self._line.setdefault(owner, None)
        self._grant()
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self._release(owner)  # granted as it was cancelled: the turn passes on
            else:
                self._withdraw(owner, granted)
            raise
        try:
            yield
        finally:
            self._release(owner)

    def _grant(self) -> None:
        while len(self.running) < self.at_once and self._line:
            owner = next(iter(self._line))
            queue = self._queues[owner]
            granted = queue.popleft()
            if not queue:
                del self._queues[owner]
                del self._line[owner]
            if granted.done():
                continue  # cancelled, its waiter not yet run to withdraw (a stop cancels every task at once)
            self._line.pop(owner, None)
            self.running.add(owner)
            granted.set_result(None)

    def _release(self, owner: str) -> None:
        self.running.discard(owner)
        if owner in self._queues:
            self._line[owner] = None  # its next batch waits behind every owner already waiting
        self._grant()

    def _withdraw(self, owner: str, granted: asyncio.Future[None]) -> None:
        queue = self._queues.get(owner)
        if queue is None:
            return
        with contextlib.suppress(ValueError):
            queue.remove(granted)
        if not queue:
            del self._queues[owner]
            self._line.pop(owner, None)
