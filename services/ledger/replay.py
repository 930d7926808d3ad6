"""Operator check: refold the whole history into a scratch (in-memory) ledger and diff it against the live read model.
Nothing is published, and nothing written but the scratch store."""

import asyncio
import time
from dataclasses import dataclass, field

import nats.js.errors
from pydantic import BaseModel

from contracts.archive import ARCHIVED_THROUGH_KEY, ArchivedThrough
from contracts.readmodel import (
    ApiKeyRecord,
    BatchRecord,
    ExecutorRecord,
    FileRecord,
    HoldersIndexed,
)
from contracts.subjects import (
    HOLDERS_INDEXED_KEY,
    MEMBERS_INDEXED_KEY,
    OVERDRAWN_INDEXED_KEY,
    owner_live_key,
)
from services.ledger.application import Ledger, persistence_env
from services.ledger.archive import Archive
from services.ledger.handlers import LEDGER_FOLD, Folder
from services.ledger.projection import Projection, projection_key, stored
from services.ledger.restore import restore
from services.runtime.nats import eventlog
from services.runtime.nats.bus import EventBus
from services.runtime.nats.folds import running
from services.runtime.nats.kv import latest_entries
from services.runtime.nats.read_entries import holder_entries, live_lists, side_entries
from services.runtime.nats.readmodel import ReadModel
from services.runtime.nats.stored_bytes import stored_records


@dataclass
class Replayed:
    records: dict[str, BaseModel] = field(default_factory=dict)
    """Every record the stream folds into, by read-model key."""
    events: int = 0
    """Facts folded: archived ones (`full`) and the stream's after the archived point."""
    seconds: float = 0.0
    chain_head: str = ""
    archived_through: int = 0
    """The archived point the replay started from (0: the stream from sequence 1)."""
    seeded: int = 0
    """Aggregates taken from the archive's snapshot."""

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0


async def replay_into_scratch(bus: EventBus, group_size: int = 5000, archive: Archive | None = None,
                              full: bool = False) -> Replayed:
    """Fold the history up to the stream's current head into a scratch ledger: from the archive's newest point
    when there is one (its snapshot, or with `full` all its segments), then the stream after it."""
    head = await eventlog.head(bus)
    replayed = Replayed()
    point = await archive.latest_point() if archive is not None else None

    async def collect(projections: list[Projection]) -> None:
        for projection in projections:
            replayed.records[projection_key(projection)] = stored(projection)
            for key, entry in side_entries(stored(projection)).items():
                if entry is None:
                    replayed.records.pop(key, None)
                else:
                    replayed.records[key] = entry
            if not isinstance(projection, ExecutorRecord):  # filed once the keys are known (below)
                replayed.records.update(holder_entries(projection_key(projection), stored(projection)))

    ledger = Ledger(persistence_env(None))
    started = time.perf_counter()
    archived = 0
    if archive is not None and point is not None:
        restored = await restore(ledger, archive, point, collect, 0, group_size, full)
        replayed.archived_through, archived, replayed.seeded = restored.point, restored.folded, restored.seeded
        replayed.records[ARCHIVED_THROUGH_KEY] = ArchivedThrough(index=point.index, last_sequence=point.last_sequence)
    folder = Folder(ledger, collect, start_after=replayed.archived_through, group_size=group_size)
    stop = asyncio.Event()
    worker = asyncio.create_task(folder.run(stop))
    try:
        async with running([LEDGER_FOLD], bus, folder):  # the ledger's own fold, into the scratch folder
            await folder.wait_through(head)
    finally:
        stop.set()
        await worker
        replayed.seconds = time.perf_counter() - started
        replayed.events = archived + folder.folded
        replayed.chain_head = ledger.chain_state()[1]
        ledger.close()
    batches = [record for record in replayed.records.values() if isinstance(record, BatchRecord)]
    replayed.records.update((owner_live_key(owner), ids) for owner, ids in live_lists(batches).items())
    replayed.records.update(stored_records(r for r in replayed.records.values() if isinstance(r, FileRecord)))
    key_providers = {r.key_id: r.provider_id for r in replayed.records.values() if isinstance(r, ApiKeyRecord)}
    for key, record in [(key, r) for key, r in replayed.records.items() if isinstance(r, ExecutorRecord)]:
        provider_of_key = key_providers.get(record.worker_key_id) if record.worker_key_id is not None else None
        replayed.records.update(holder_entries(key, record, provider_of_key))
    for mark in (HOLDERS_INDEXED_KEY, MEMBERS_INDEXED_KEY, OVERDRAWN_INDEXED_KEY):
        replayed.records[mark] = HoldersIndexed(True)
    return replayed


async def diff_against_live(bus: EventBus, read_model: ReadModel, replayed: Replayed | None = None) -> list[str]:
    """Keys whose live record differs from a fresh replay; empty when the live read model is right. Facts published
    while the check runs can make the live side newer: rerun before trusting a difference."""
    replayed = replayed or await replay_into_scratch(bus)
    differences: list[str] = []
    for key, expected in replayed.records.items():
        try:
            value = (await read_model.kv.get(key)).value
        except nats.js.errors.KeyNotFoundError:
            value = None
        if value is None:
            differences.append(f"{key}: missing from the read model")
            continue
        live = type(expected).model_validate_json(value)
        if live.model_dump() != expected.model_dump():
            differences.append(f"{key}: live {live.model_dump_json()} != replayed {expected.model_dump_json()}")
    try:
        live_keys = {key for key, _ in await latest_entries(read_model.kv)}
    except nats.js.errors.NoKeysError:
        live_keys = set()
    differences += [f"{key}: in the read model, but no fact in the log makes it"
                    for key in sorted(live_keys - replayed.records.keys())]
    return differences
