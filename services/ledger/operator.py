"""Operators' tools behind `sheshnag ledger replay|audit|verify|export`; each returns the process exit code."""

import asyncio
import json
import sys
from datetime import datetime
from typing import TextIO

from contracts.events.registry import decode_event
from contracts.subjects import batch_events
from services.ledger.application import Ledger
from services.ledger.chain import first_break
from services.ledger.replay import diff_against_live, replay_into_scratch
from services.ledger.settings import LedgerSettings
from services.ledger.timeline import render_table, timeline
from services.runtime import eventlog
from services.runtime.bus import TOOL_ATTEMPTS, EventBus
from services.runtime.readmodel import ReadModel


async def replay(settings: LedgerSettings, out: TextIO = sys.stdout) -> int:
    """Rebuild every aggregate from sequence 1 into a scratch store and diff it against the live read model."""
    bus = await EventBus.connect(settings.connection.nats_url, "ledger-replay", attempts=TOOL_ATTEMPTS)
    try:
        replayed = await replay_into_scratch(bus, settings.group_size)
        differences = await diff_against_live(bus, await ReadModel.open(bus), replayed)
    finally:
        await bus.close()
    print(f"replayed {replayed.events} events into {len(replayed.records)} records in {replayed.seconds:.2f}s "
          f"({replayed.rate:,.0f} events/s); chain head {replayed.chain_head[:16] or '-'}", file=out)
    for difference in differences:
        print(f"DIFFERS {difference}", file=out)
    print(f"{len(differences)} differences" if differences else "live read model matches the replay", file=out)
    return 1 if differences else 0


async def audit(settings: LedgerSettings, batch_id: str, as_json: bool, out: TextIO = sys.stdout) -> int:
    """A batch's full timeline from the log, as a table or JSONL."""
    bus = await EventBus.connect(settings.connection.nats_url, "ledger-audit", attempts=TOOL_ATTEMPTS)
    try:
        facts = [(fact.sequence, decode_event(fact.data)) async for fact in eventlog.read(bus, batch_events(batch_id))]
    finally:
        await bus.close()
    if not facts:
        print(f"no events for batch {batch_id}", file=sys.stderr)
        return 1
    rows = await asyncio.to_thread(timeline, facts)
    if as_json:
        for row in rows:
            print(json.dumps(row.as_dict()), file=out)
    else:
        print(render_table(rows), file=out)
    return 0


async def verify(settings: LedgerSettings, out: TextIO = sys.stdout) -> int:
    """Recompute the hash chain from the log and compare it with the ledger's checkpointed links."""
    ledger = await asyncio.to_thread(Ledger, settings.store_env())
    try:
        links = await asyncio.to_thread(ledger.chain_links)
    finally:
        await asyncio.to_thread(ledger.close)
    if not links:
        print("the ledger has checkpointed no events yet; nothing to verify", file=out)
        return 0
    bus = await EventBus.connect(settings.connection.nats_url, "ledger-verify", attempts=TOOL_ATTEMPTS)
    try:
        log = [fact async for fact in eventlog.read(bus, after=links[0].first_sequence - 1)]
    finally:
        await bus.close()
    checked, found = first_break(links, log)
    if found is None:
        print(f"verified {checked} events through sequence {links[-1].first_sequence + len(links[-1].digests) - 1}"
              f"; chain head {links[-1].head}", file=out)
        return 0
    print(f"chain breaks at sequence {found.sequence}: {found.reason} ({checked} events verified before it)",
          file=out)
    return 1


async def export(settings: LedgerSettings, since: datetime | None, until: datetime | None,
                 out: TextIO = sys.stdout) -> int:
    """The events published in [since, until] as JSONL: sequence, subject, published time and the event."""
    bus = await EventBus.connect(settings.connection.nats_url, "ledger-export", attempts=TOOL_ATTEMPTS)
    try:
        async for fact in eventlog.read(bus, since=since):
            published = eventlog.published_at(fact)
            if until is not None and published is not None and published > until:
                break
            print(json.dumps({"sequence": fact.sequence, "subject": fact.subject,
                              "published_at": published and published.isoformat(), "event": json.loads(fact.data)}),
                  file=out)
    finally:
        await bus.close()
    return 0
