"""Indexes older ledgers lack, each made once: fold again the facts that create keys, files and batches, so every file
and batch is re-projected under its key's user (a refold at or below the checkpoint changes no aggregate, it only adds
what older code never made); write owners' lists of live batches and their stored bytes from the records; file
keys, providers and executors under their holders, users under their organisations, and the overdrawn accounts."""

import asyncio
import logging

from eventsourcing.persistence import Tracking

from contracts.subjects import (
    BATCH_CREATED,
    EVENTS_STREAM,
    FILE_STORED,
    HOLDERS_INDEXED_KEY,
    KEY_CREATED,
    MEMBERS_INDEXED_KEY,
    OVERDRAWN_INDEXED_KEY,
)
from services.ledger.application import Ledger
from services.ledger.chain import Fact
from services.ledger.handlers import Sink
from services.ledger.projection import Projection, executor_record, records_of
from services.runtime.nats import eventlog
from services.runtime.nats.bus import EventBus
from services.runtime.nats.readmodel import ReadModel

log = logging.getLogger(__name__)

OWNER_INDEX = f"{EVENTS_STREAM}:owner_index"
LIVE_INDEX = f"{EVENTS_STREAM}:owner_live_index"
STORED_INDEX = f"{EVENTS_STREAM}:owner_stored_index"
HOLDER_INDEX = f"{EVENTS_STREAM}:holder_index"
MEMBER_INDEX = f"{EVENTS_STREAM}:member_index"
OVERDRAWN_INDEX = f"{EVENTS_STREAM}:overdrawn_index"
"""Tracking names, each present once its index is made (a store that starts empty makes them as it folds)."""
CREATING_SUBJECTS = (KEY_CREATED, FILE_STORED, BATCH_CREATED)
"""Keys first: a file's or batch's owner is its key's user."""
GROUP = 1000


async def index_owners(bus: EventBus, ledger: Ledger, sink: Sink, checkpoint: int) -> None:
    """Index the owners of everything folded up to `checkpoint`, unless done before."""
    if await asyncio.to_thread(ledger.tracking.max_tracking_id, OWNER_INDEX):
        return
    if checkpoint:
        log.info("indexing the owners of files and batches folded up to sequence %d", checkpoint)
        for subject in CREATING_SUBJECTS:
            facts = [fact async for fact in eventlog.read(bus, subject) if fact.sequence <= checkpoint]
            for start in range(0, len(facts), GROUP):
                await sink(await asyncio.to_thread(_refold, ledger, facts[start:start + GROUP]))
    await asyncio.to_thread(ledger.tracking.insert_tracking, Tracking(application_name=OWNER_INDEX, notification_id=1))


async def index_read_model(ledger: Ledger, read_model: ReadModel, checkpoint: int) -> None:
    """Write owners' lists of live batches, then their stored bytes, from the records up to `checkpoint`, each once."""
    for name, index, done in ((LIVE_INDEX, read_model.index_live_batches, "listed the live batches of %d owners"),
                              (STORED_INDEX, read_model.index_stored_bytes, "wrote the stored bytes of %d owners")):
        if await asyncio.to_thread(ledger.tracking.max_tracking_id, name):
            continue
        count = await index() if checkpoint else 0
        if count:
            log.info(done, count)
        await asyncio.to_thread(ledger.tracking.insert_tracking, Tracking(application_name=name, notification_id=1))


async def index_holders(ledger: Ledger, read_model: ReadModel, sink: Sink) -> None:
    """File every key, provider and executor under its holders, once (said done even when there are none yet): the
    executors' records are written again from the ledger (older records do not name their provider)."""
    if await asyncio.to_thread(ledger.tracking.max_tracking_id, HOLDER_INDEX):
        return
    count = await read_model.index_holders()  # keys first: an executor is filed under its worker key's provider
    ids = [record.executor_id for record in await read_model.list_executors()]
    records = await asyncio.to_thread(_executors_again, ledger, ids)
    for start in range(0, len(records), GROUP):
        await sink(records[start:start + GROUP])
    await read_model.mark_indexed(HOLDERS_INDEXED_KEY)
    if count or records:
        log.info("filed %d keys and providers and %d executors under their holders", count, len(records))
    await asyncio.to_thread(ledger.tracking.insert_tracking, Tracking(application_name=HOLDER_INDEX,
                                                                      notification_id=1))


async def index_members_and_overdrawn(ledger: Ledger, read_model: ReadModel) -> None:
    """File every user under its organisation, and every overdrawn account, each once (said done even when there
    are none yet)."""
    for name, index, mark, done in (
            (MEMBER_INDEX, read_model.index_members, MEMBERS_INDEXED_KEY, "filed %d users under their organisations"),
            (OVERDRAWN_INDEX, read_model.index_overdrawn, OVERDRAWN_INDEXED_KEY, "read %d accounts for overdrafts")):
        if await asyncio.to_thread(ledger.tracking.max_tracking_id, name):
            continue
        count = await index()
        await read_model.mark_indexed(mark)
        if count:
            log.info(done, count)
        await asyncio.to_thread(ledger.tracking.insert_tracking, Tracking(application_name=name, notification_id=1))


def _executors_again(ledger: Ledger, executor_ids: list[str]) -> list[Projection]:
    return [executor_record(executor) for executor in map(ledger.executor, executor_ids) if executor is not None]


def _refold(ledger: Ledger, facts: list[Fact]) -> list[Projection]:
    return records_of(ledger.fold_facts(facts), ledger.user_of_key)

