"""Operators' tools behind `sheshnag ledger replay|audit|verify|export`; each returns the process exit code."""

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from dataclasses import asdict
from datetime import datetime
from typing import TextIO

from contracts.events.registry import decode_event
from contracts.subjects import batch_events
from services.ledger.application import Ledger
from services.ledger.archive import Archive, ArchiveBroken, ArchivePoint
from services.ledger.chain import ChainCheck, Fact
from services.ledger.replay import diff_against_live, replay_into_scratch
from services.ledger.restore import archived_through
from services.ledger.settings import LedgerSettings
from services.ledger.timeline import render_table, timeline
from services.runtime.nats import eventlog
from services.runtime.nats.bus import EventBus, tool_bus
from services.runtime.nats.readmodel import ReadModel
from services.runtime.storage.objectstore import ObjectStore


@contextlib.asynccontextmanager
async def archive_if_trimmed(settings: LedgerSettings, read_model: ReadModel) -> AsyncIterator[Archive | None]:
    """The archive, when the stream was trimmed (the read model says so); None when it holds every fact."""
    if await archived_through(read_model) is None:
        yield None
        return
    store = ObjectStore.from_settings(settings.connection)
    try:
        yield Archive(store)
    finally:
        store.close()


async def replay(settings: LedgerSettings, out: TextIO = sys.stdout, full: bool = False) -> int:
    """Rebuild every aggregate into a scratch store (`replay_into_scratch`) and diff it against the live read model."""
    async with tool_bus(settings.connection.nats_url, "ledger-replay") as bus:
        read_model = await ReadModel.open(bus)
        async with archive_if_trimmed(settings, read_model) as archive:
            replayed = await replay_into_scratch(bus, settings.group_size, archive, full)
        differences = await diff_against_live(bus, read_model, replayed)
    source = "its segments" if full else f"{replayed.seeded} aggregates from its snapshot"
    start = f"archived point {replayed.archived_through} ({source})" if replayed.archived_through else "sequence 1"
    print(f"replayed {replayed.events} events from {start} into {len(replayed.records)} records in "
          f"{replayed.seconds:.2f}s ({replayed.rate:,.0f} events/s); chain head {replayed.chain_head[:16] or '-'}",
          file=out)
    for difference in differences:
        print(f"DIFFERS {difference}", file=out)
    print(f"{len(differences)} differences" if differences else "live read model matches the replay", file=out)
    return 1 if differences else 0


async def audit(settings: LedgerSettings, batch_id: str, as_json: bool, out: TextIO = sys.stdout) -> int:
    """A batch's full timeline from the log, as a table or JSONL."""
    async with tool_bus(settings.connection.nats_url, "ledger-audit") as bus:
        logged = {fact.sequence: fact async for fact in eventlog.read(bus, batch_events(batch_id))}
        async with archive_if_trimmed(settings, await ReadModel.open(bus)) as archive:
            if archive is not None:  # an archived batch's log, and any fact about it stored since
                logged = {fact.sequence: fact for fact in await archive.batch_log(batch_id)} | logged
        facts = [(sequence, decode_event(logged[sequence].data)) for sequence in sorted(logged)]
    if not facts:
        print(f"no events for batch {batch_id}", file=sys.stderr)
        return 1
    rows = await asyncio.to_thread(timeline, facts)
    if as_json:
        for row in rows:
            print(json.dumps(asdict(row)), file=out)
    else:
        print(render_table(rows), file=out)
    return 0


async def verify(settings: LedgerSettings, out: TextIO = sys.stdout) -> int:
    """Recompute the hash chain from the log (archived segments first, once trimmed) and compare it with the links."""
    ledger = await asyncio.to_thread(Ledger, settings.store_env())
    try:
        links = await asyncio.to_thread(ledger.chain_links)
    finally:
        await asyncio.to_thread(ledger.close)
    check = ChainCheck(links)
    async with tool_bus(settings.connection.nats_url, "ledger-verify") as bus:
        async with archive_if_trimmed(settings, await ReadModel.open(bus)) as archive:
            point = await archive.latest_point() if archive is not None else None
            if not links and point is None:
                print("the ledger has checkpointed no events yet; nothing to verify", file=out)
                return 0
            try:
                async for fact in _log(bus, archive, point, links[0].first_sequence - 1 if links else 0):
                    check.feed(fact)
            except ArchiveBroken as broken:
                print(f"archive breaks at {broken}", file=out)
                return 1
    checked, found = check.result()
    if found is None:
        through = links[-1].first_sequence + len(links[-1].digests) - 1 if links else point and point.last_sequence
        archived = f" (sequences up to {point.last_sequence} from {point.index} archived segments)" if point else ""
        print(f"verified {checked} events through sequence {through}{archived}; chain head {check.head}", file=out)
        return 0
    print(f"chain breaks at sequence {found.sequence}: {found.reason} ({checked} events verified before it)", file=out)
    return 1


async def _log(bus: EventBus, archive: Archive | None, point: ArchivePoint | None, after: int) -> AsyncIterator[Fact]:
    """The log to check: the archived segments (each checked as read), then the stream after them."""
    if archive is not None and point is not None:
        async for fact in archive.verified_facts(point):
            yield fact
        after = point.last_sequence
    async for fact in eventlog.read(bus, after=after):
        yield fact


async def export(settings: LedgerSettings, since: datetime | None, until: datetime | None,
                 out: TextIO = sys.stdout) -> int:
    """The events published in [since, until] as JSONL: sequence, subject, published time and the event."""
    async with tool_bus(settings.connection.nats_url, "ledger-export") as bus:
        async for fact in eventlog.read(bus, since=since):
            published = eventlog.published_at(fact)
            if until is not None and published is not None and published > until:
                break
            print(json.dumps({"sequence": fact.sequence, "subject": fact.subject,
                              "published_at": published and published.isoformat(), "event": json.loads(fact.data)}),
                  file=out)
    return 0
