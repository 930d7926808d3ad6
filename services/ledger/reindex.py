"""Once, for a ledger that folded facts before ownership by user existed: fold again the facts that create keys, files
and batches, so each key's user is known and every file and batch is re-projected under its owner.

Refolding a fact at or below the checkpoint changes no aggregate; it only adds what older code never made.
"""

import asyncio
import logging

from eventsourcing.persistence import Tracking

from contracts.subjects import BATCH_CREATED, EVENTS_STREAM, FILE_STORED, KEY_CREATED
from services.ledger.application import Ledger
from services.ledger.chain import Fact
from services.ledger.handlers import Sink
from services.ledger.projection import Projection, project
from services.runtime import eventlog
from services.runtime.bus import EventBus

log = logging.getLogger(__name__)

OWNER_INDEX = f"{EVENTS_STREAM}:owner_index"
"""Tracking name, present once the owners are indexed (a store that starts empty is indexed as it folds)."""
CREATING_SUBJECTS = (KEY_CREATED, FILE_STORED, BATCH_CREATED)
"""Keys first: a file's or batch's owner is its key's user."""
GROUP = 1000


async def index_owners(bus: EventBus, ledger: Ledger, sink: Sink, checkpoint: int) -> int:
    """Index the owners of everything folded up to `checkpoint`, unless done before; the facts refolded."""
    if await asyncio.to_thread(ledger.tracking.max_tracking_id, OWNER_INDEX):
        return 0
    refolded = 0
    if checkpoint:
        log.info("indexing the owners of files and batches folded up to sequence %d", checkpoint)
        for subject in CREATING_SUBJECTS:
            facts = [fact async for fact in eventlog.read(bus, subject)]
            facts = [fact for fact in facts if fact.sequence <= checkpoint]
            for start in range(0, len(facts), GROUP):
                group = facts[start:start + GROUP]
                await sink(await asyncio.to_thread(_refold, ledger, group))
                refolded += len(group)
    await asyncio.to_thread(ledger.tracking.insert_tracking, Tracking(application_name=OWNER_INDEX,
                                                                      notification_id=1))
    return refolded


def _refold(ledger: Ledger, facts: list[Fact]) -> list[Projection]:
    projections = (project(aggregate, ledger.user_of_key) for aggregate in ledger.fold_facts(facts))
    return [projection for projection in projections if projection is not None]

