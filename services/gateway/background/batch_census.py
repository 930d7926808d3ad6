"""The batch census behind the fleet-wide gauges: batches per status, kept by one watch on the read model's batch
records, so a refresh reads only open work. Ended batches are counts (plus a bounded memory of ended ids, so a rewrite
is not counted twice); each (re)count, at start, after a broken watch and hourly, replaces the last once complete."""

import asyncio
import contextlib
import logging
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

import nats.errors
import nats.js.errors
import pydantic
from nats.js.kv import KeyValue

from contracts.lifecycle import TERMINAL
from contracts.readmodel import BatchRecord
from contracts.subjects import read_model_key

log = logging.getLogger(__name__)

RECENTLY_ENDED = 100_000
"""Ended batch ids remembered, so a record written again after its batch ended is not counted twice."""
RESUME_AFTER_S = 1.0
RECOUNT_S = 3600.0
"""How often the census counts every batch again from the read model (bounding what a late rewrite miscounts)."""


@dataclass
class Counts:
    open: dict[str, BatchRecord] = field(default_factory=dict)
    """Every unfinished batch's latest record."""
    ended: Counter[str] = field(default_factory=Counter)
    """Ended batches, by status."""
    recently_ended: OrderedDict[str, str] = field(default_factory=OrderedDict)

    def record(self, batch_id: str, record: BatchRecord | None) -> None:
        """Count the latest record of a batch (None: its record was deleted)."""
        if batch_id in self.recently_ended:
            self.ended[self.recently_ended.pop(batch_id)] -= 1
        self.open.pop(batch_id, None)
        if record is None:
            return
        status = record.batch.status
        if status in TERMINAL:
            self.ended[status] += 1
            self.recently_ended[batch_id] = status
            if len(self.recently_ended) > RECENTLY_ENDED:
                self.recently_ended.popitem(last=False)  # rewritten much later: counted once more, until a recount
        else:
            self.open[batch_id] = record

    def by_status(self) -> dict[str, int]:
        counts: Counter[str] = Counter(record.batch.status for record in self.open.values())
        counts.update(self.ended)
        return {status: count for status, count in counts.items() if count > 0}


@dataclass
class BatchCensus(Counts):
    """The counts the gauges read: replaced whole once a (re)count has read every batch's current record."""

    ready: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the watch has delivered every batch's current record."""

    def reset(self, counts: Counts | None = None) -> None:
        """Take `counts` (none: empty ones) in place of the current, all at once: never half a count."""
        counts = counts or Counts()
        self.open, self.ended, self.recently_ended = counts.open, counts.ended, counts.recently_ended

    async def follow(self, kv: KeyValue) -> None:
        """Keep the census as the read model changes, counting again on the side every `RECOUNT_S` (a record
        rewritten long after its batch ended then counts once, not twice) and after a broken watch."""
        prefix = read_model_key("batch", "")
        while True:
            try:
                watcher = await kv.watch(read_model_key("batch", "*"))
                counting, started = Counts(), time.monotonic()
                try:
                    async for entry in watcher:
                        if entry is None:  # the end of the current values
                            self.reset(counting)
                            self.ready.set()
                            continue
                        counting.record(entry.key.removeprefix(prefix), decode(entry.key, entry.value))
                        if self.ready.is_set() and time.monotonic() - started > RECOUNT_S:
                            break
                finally:
                    with contextlib.suppress(nats.errors.Error, nats.js.errors.Error):
                        await watcher.stop()
                if self.open is counting.open:
                    continue  # a recount: at once
            except (nats.errors.Error, nats.js.errors.Error) as error:
                log.warning("the batch census's watch was interrupted, resuming: %r", error)
            await asyncio.sleep(RESUME_AFTER_S)


def decode(key: str, value: bytes | None) -> BatchRecord | None:
    if not value:
        return None
    try:
        return BatchRecord.model_validate_json(value)
    except pydantic.ValidationError:
        log.warning("a batch record at %s does not decode; not counted", key)
        return None
