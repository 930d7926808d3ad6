"""How far the read model holds the log, as the folding ledger says after each group (`LEDGER_FOLDED`), and the
read-back of this gateway's own write that waits for it: one read once the write is folded, not a poll every few
milliseconds until it is (the ledger, busy, folds in groups 50 ms apart). A notice lost, late or forged costs only
time: the read model itself is what is read, and without notices a read-back still reads every `NOTICE_WAIT_S`."""

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from nats.aio.msg import Msg

from contracts.subjects import LEDGER_FOLDED
from services.runtime.nats.answers import RawAnswer
from services.runtime.nats.delivery import ServiceRouter

NOTICE_WAIT_S = 0.25
"""The longest a read-back waits for a notice before it reads anyway (notices lost, or a ledger that sends none)."""
TOLD_POLL_S = 0.05
"""Between reads while a notice says the write is folded and the read model does not show its record yet."""
MOST_DIGITS = 20
FOLDS = "fold_notices"
"""The `FoldNotices` in the broker's context."""
NOTICES = RawAnswer(LEDGER_FOLDED, queue="")
"""Every gateway takes every notice (no queue group); nothing is answered."""
Record = TypeVar("Record")


@dataclass
class FoldNotices:
    through: int = 0
    """The highest EVENTS sequence a notice said the read model holds every fact through."""
    _told: asyncio.Event = field(default_factory=asyncio.Event)
    """Set (and replaced) when `through` grows: wakes every read-back waiting."""

    def take(self, data: bytes) -> None:
        if not (data.isdigit() and len(data) <= MOST_DIGITS) or int(data) <= self.through:
            return
        self.through = int(data)
        told, self._told = self._told, asyncio.Event()
        told.set()

    async def on_notice(self, message: Msg) -> None:
        self.take(message.data)

    async def folded(self, sequence: int, within_s: float) -> bool:
        """Whether a notice says `sequence` is folded, waiting up to `within_s` for one that does."""
        try:
            async with asyncio.timeout(within_s):
                while self.through < sequence:
                    await self._told.wait()
        except TimeoutError:
            return False
        return True

    async def read_back(self, fetch: Callable[[], Awaitable[Record | None]], sequence: int,
                        within_s: float) -> Record | None:
        """What `fetch` reads once the fact at `sequence` (this gateway's own write) is folded; None when the read
        model does not show it within `within_s` (the ledger is behind or down)."""
        deadline = time.monotonic() + within_s
        while True:
            told = await self.folded(sequence, max(0.0, min(NOTICE_WAIT_S, deadline - time.monotonic())))
            record = await fetch()
            if record is not None or time.monotonic() >= deadline:
                return record
            if told:
                await asyncio.sleep(TOLD_POLL_S)


def fold_notice_router() -> ServiceRouter:
    """The gateway's table of the ledger's notices, on the `FoldNotices` named `FOLDS` in the broker's context."""
    router = ServiceRouter("gateway", dependencies=FOLDS)
    router.answers(NOTICES, FoldNotices.on_notice, "Take the ledger's notice of how far the read model holds the log.")
    return router
