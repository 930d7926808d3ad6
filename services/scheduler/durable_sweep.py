"""Durables of executors gone for good: one declared lost and silent for `GONE_AFTER_MS` has its two WORK durables
deleted, so ids that never come back do not fill the stream's consumers (an executor that does come back registers
again, and its registration makes them again: services/scheduler/registration.py). Leader-only, a few a minute."""

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

import nats.errors
import nats.js.errors

from contracts.subjects import WORK_STREAM, executor_durable, executor_finalize_durable
from services.runtime.nats.bus import EventBus
from services.scheduler.book import Book

log = logging.getLogger(__name__)

GONE_AFTER_MS = 7 * 24 * 3_600_000
SWEEP_EVERY_MS = 60_000
PER_SWEEP = 64
"""Ids swept in one go (two deletes each): a term's first sweeps work through a long list a minute at a time."""


@dataclass
class DurableSweep:
    bus: EventBus
    registering: asyncio.Lock
    """The registrar's: no registration (which makes an id's durables) comes between a check and a delete."""
    swept: set[str] = field(default_factory=set)
    """Ids whose durables this term deleted (an id back and lost again is swept again)."""
    at_ms: int = 0

    async def run(self, book: Book, advertised: set[str], now_ms: int) -> None:
        """Sweep, at most once a minute; `advertised`: ids with an advert in the executors bucket (alive, whatever the
        book says). A failure is logged and tried again at the next sweep: a tick goes on."""
        if now_ms - self.at_ms < SWEEP_EVERY_MS:
            return
        self.at_ms = now_ms
        self.swept &= set(book.lost)
        gone = sorted(executor_id for executor_id, last_heard in book.lost.items()
                      if now_ms - last_heard >= GONE_AFTER_MS and executor_id not in self.swept | advertised)
        for executor_id in gone[:PER_SWEEP]:
            try:
                await self._sweep(book, executor_id, now_ms)
            except (nats.errors.Error, TimeoutError) as error:
                log.warning("the durables of executor %s were not deleted (%r); tried again later", executor_id, error)

    async def _sweep(self, book: Book, executor_id: str, now_ms: int) -> None:
        async with self.registering:
            last_heard = book.lost.get(executor_id)  # again: a registration may have come since the list was made
            if last_heard is None or now_ms - last_heard < GONE_AFTER_MS:
                return
            for name in (executor_durable(executor_id), executor_finalize_durable(executor_id)):
                with contextlib.suppress(nats.js.errors.NotFoundError):
                    await self.bus.js.delete_consumer(WORK_STREAM, name)
        self.swept.add(executor_id)
        log.info("executor %s silent for %d days: its durables deleted (a registration makes them again)",
                 executor_id, (now_ms - last_heard) // 86_400_000)
