"""A ledger whose store is behind the archive catches up from it before it reads the stream: an empty store is
seeded from the newest snapshot, any other folds the archived facts it lacks (or, `full`, every archived fact)."""

import asyncio
import logging
import time
from dataclasses import dataclass

import nats.errors
import nats.js.errors

from contracts.archive import ARCHIVED_THROUGH_KEY, ArchivedThrough
from services.ledger.application import Ledger
from services.ledger.archive import Archive, ArchivePoint, groups
from services.ledger.handlers import Sink
from services.ledger.projection import Projection, folded_records
from services.ledger.snapshot import projections, seed
from services.runtime.nats.broker import BROKER_HICCUPS
from services.runtime.nats.readmodel import ReadModel

log = logging.getLogger(__name__)

SINK_GROUP = 1000
"""Records put into the sink at once."""


@dataclass
class Restored:
    point: int
    """The archived point the ledger now stands at (its checkpoint)."""
    seeded: int = 0
    """Aggregates taken from the snapshot."""
    folded: int = 0
    """Archived facts folded."""


HICCUP_PATIENCE_S = 60.0


async def archived_through(read_model: ReadModel, patience_s: float = HICCUP_PATIENCE_S) -> ArchivedThrough | None:
    """The newest archived point per the read model (None: never trimmed); a hiccup is retried for `patience_s`."""
    deadline, delay = time.monotonic() + patience_s, 0.2
    while True:
        try:
            entry = await read_model.kv.get(ARCHIVED_THROUGH_KEY)
        except nats.js.errors.KeyNotFoundError:
            return None
        except BROKER_HICCUPS as hiccup:
            if time.monotonic() + delay > deadline:
                raise
            log.info("the read model did not answer (%s); asking again", type(hiccup).__name__)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
            continue
        return ArchivedThrough.model_validate_json(entry.value) if entry.value else None


async def restore(ledger: Ledger, archive: Archive, point: ArchivePoint, sink: Sink, checkpoint: int,
                  group_size: int = 5000, full: bool = False) -> Restored:
    """Bring a ledger at `checkpoint` (< the point) to the archived point."""
    restored = Restored(point.last_sequence)
    empty = checkpoint == 0 and (await asyncio.to_thread(ledger.chain_state))[0] == 0
    if empty and not full:
        _, anomalies, snapshots = await archive.snapshot(point.index)
        stored = await asyncio.to_thread(seed, ledger, snapshots, point.last_sequence)
        records: list[Projection] = [*await asyncio.to_thread(projections, ledger, stored), *anomalies]
        await _put(sink, records)
        restored.seeded = len(snapshots)
    else:
        async for group in groups(archive.facts(point.index, after=checkpoint), group_size):
            await _put(sink, await asyncio.to_thread(folded_records, ledger, group))
            restored.folded += len(group)
    await asyncio.to_thread(ledger.record_checkpoint, point.last_sequence)
    log.info("ledger restored to archived point %d (sequence %d): %d aggregates from its snapshot, %d archived facts "
             "folded", point.index, point.last_sequence, restored.seeded, restored.folded)
    return restored


async def _put(sink: Sink, records: list[Projection]) -> None:
    for start in range(0, len(records), SINK_GROUP):
        await sink(records[start:start + SINK_GROUP])
