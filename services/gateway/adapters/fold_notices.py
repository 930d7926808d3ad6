"""How far the read model holds the log, as the ledger's notices say (`LEDGER_FOLDED`), and the read-back of this
gateway's own write that waits for them instead of polling. A notice is only a hint: the read model is what is read;
without notices a read-back polls, and told but not shown (forged, reset, lagging) it reads again, backing off."""

import asyncio
import heapq
import itertools
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from nats.aio.msg import Msg

from contracts.subjects import LEDGER_FOLDED
from services.runtime.nats.answers import RawAnswer
from services.runtime.nats.delivery import ServiceRouter

NOTICE_WAIT_S = 0.25
"""The longest a read-back waits for a notice before it reads anyway."""
FIRST_POLL_S = 0.01
LAST_POLL_S = 0.2
"""Reads without a notice to go by are this far apart at first, doubling up to `LAST_POLL_S`."""
MOST_DIGITS = 20
PRUNE_AT = 1024
"""Waiters listed past which the finished are dropped (then again only once the list doubled: no pass per waiter)."""
FOLDS = "fold_notices"
"""The `FoldNotices` in the broker's context."""
NOTICES = RawAnswer(LEDGER_FOLDED, queue="", traced=False)
"""Every gateway takes every notice (no queue group), a few a second each: no span per notice."""
Record = TypeVar("Record")


@dataclass
class FoldNotices:
    through: int = 0
    """The EVENTS sequence the read model holds every fact through, as the last notice said (a new stream restarts)."""
    heard: bool = False
    _waiting: list[tuple[int, int, asyncio.Future[None]]] = field(default_factory=list)
    """(sequence, tie, waiter): a heap, so a notice wakes only the read-backs it answers."""
    _tie: Iterator[int] = field(default_factory=itertools.count)
    _prune_at: int = PRUNE_AT

    def take(self, data: bytes) -> None:
        if len(data) > MOST_DIGITS or not data.isdigit():
            return
        self.through, self.heard = int(data), True
        while self._waiting and self._waiting[0][0] <= self.through:
            _, _, waiter = heapq.heappop(self._waiting)
            if not waiter.done():
                waiter.set_result(None)

    async def on_notice(self, message: Msg) -> None:
        self.take(message.data)

    async def folded(self, sequence: int, within_s: float) -> bool:
        """Whether a notice says `sequence` is folded, waiting up to `within_s` for one that does."""
        if self.through >= sequence:
            return True
        if len(self._waiting) >= self._prune_at:
            self._waiting = [entry for entry in self._waiting if not entry[2].done()]
            heapq.heapify(self._waiting)
            self._prune_at = max(PRUNE_AT, 2 * len(self._waiting))
        waiter = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (sequence, next(self._tie), waiter))
        try:
            async with asyncio.timeout(within_s):
                await waiter
        except TimeoutError:
            return False
        return True

    async def read_back(self, fetch: Callable[[], Awaitable[Record | None]], sequence: int, within_s: float,
                        ready: Callable[[Record], bool] = lambda _: True) -> Record | None:
        """What `fetch` reads once this gateway's own write at `sequence` is folded and the record `ready`; past
        `within_s` (the ledger behind or down), what it showed last (None: nothing)."""
        deadline = time.monotonic() + within_s
        pause = FIRST_POLL_S
        while True:
            left = max(0.0, deadline - time.monotonic())
            told = self.heard and await self.folded(sequence, min(NOTICE_WAIT_S, left))
            if not self.heard:
                await asyncio.sleep(min(pause, left))
            record = await fetch()
            if (record is not None and ready(record)) or time.monotonic() >= deadline:
                return record
            if told:
                await asyncio.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            if told or not self.heard:
                pause = min(pause * 2, LAST_POLL_S)


def fold_notice_router() -> ServiceRouter:
    """The gateway's table of the ledger's notices, on the `FoldNotices` named `FOLDS` in the broker's context."""
    router = ServiceRouter("gateway", dependencies=FOLDS)
    router.answers(NOTICES, FoldNotices.on_notice, "Take the ledger's notice of how far the read model holds the log.")
    return router
