"""Ledger fold and replay rates against the raw JetStream read rate, and replay before and after retention, measured
in the same run.

Usage: .venv/bin/python bench/ledger_replay.py [--events 300000] [--batches 300] [--open 1000] [--tail 10]
Publishes synthetic-but-valid batch lives into a fresh embedded nats-server: `--events` facts of `--batches` ended
batches, then `--open` batches that start and run on (each with `--tail` progress facts after the archived point).
Times: an ordered consumer that reads and drops every message (the baseline), the live ledger (SQLite store + KV
read model) folding from sequence 1 until caught up, and `replay` (scratch in-memory store, no side effects) of the
whole stream. Then one retention round (window 0: every ended batch leaves the stream) archives the history up to
the open batches' tails into a fresh embedded SeaweedFS, and replay runs again from its snapshot + the stream's
live part, and from every segment + the live part (`--full`); both must give the whole replay's records and chain.

Scaling run: .venv/bin/python bench/ledger_replay.py --sizes 300000,1000000,3000000,10000000 [--batch-facts 1000]
[--round 1000000] [--full-upto 1000000] [--open 1000] [--tail 10]
Builds ended history as a deployment does: rounds of at most `--round` facts of ended batches (`--batch-facts`
each), published pipelined, each round archived and trimmed by a retention round before the next (the stream never
holds more than a round plus the open work). At each size the `--open` batches get `--tail` more facts (the live
part) and replay runs from the snapshot + live stream; up to `--full-upto` also from every segment, which must
give the same records and chain. Scratch data goes under /tmp and is removed at the end.
"""

import argparse
import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orjson
from nats.aio.msg import Msg

from bench.cpu import cpu_seconds
from contracts.api.batch import BatchUsage
from contracts.archive import (
    ARCHIVE_PREFIX,
    ARCHIVED_THROUGH_KEY,
    BATCH_LOGS_PREFIX,
    SEGMENTS_PREFIX,
    snapshot_key,
)
from contracts.events.batch import (
    BatchAssigned,
    BatchProgressed,
    BatchStarted,
    BatchValidated,
)
from contracts.events.envelope import Event
from contracts.subjects import EVENTS_STREAM, EVENTS_SUBJECTS
from infra.embedded import S3Credentials, free_port, start_nats, start_seaweed, stop_process
from services.ledger.app import create_app
from services.ledger.application import Ledger, persistence_env
from services.ledger.archive import Archive, ArchivePoint
from services.ledger.replay import Replayed, replay_into_scratch
from services.ledger.retention import Policy, Retention
from services.ledger.settings import LedgerSettings
from services.runtime.nats import eventlog
from services.runtime.nats.bus import EventBus
from services.runtime.nats.readmodel import ReadModel
from services.runtime.process.settings import ConnectionSettings
from services.runtime.storage.objectstore import ObjectStore
from tests.factories import batch_created, batch_life

ACTIVE = 10
"""Batches running at once: their facts interleave in the stream."""


def life(n: int, events: int) -> list[Event]:
    """One batch from creation to completion in exactly `events` facts (at least 7)."""
    return batch_life(f"batch_bench{n:06d}", events - 6, lines_per_chunk=8, owner_key_id="key_bench",
                      input_file_id=f"file-{n}", output_file_id=f"out-{n}", tokens_per_line=(10, 5))


def running(n: int, first_chunk: int, chunks: int) -> list[Event]:
    """An open batch: its start (with `first_chunk` 0), then progress chunks; it never ends."""
    batch_id = f"batch_open{n:06d}"
    progress: list[Event] = [
        BatchProgressed(aggregate_id=batch_id, attempt=1, chunk=c, chunk_key=f"c{c}", completed=8 * (c + 1), failed=0)
        for c in range(first_chunk, first_chunk + chunks)]
    if first_chunk:
        return progress
    return [
        batch_created(batch_id, "key_bench", f"files/file-open-{n}"),
        BatchValidated(aggregate_id=batch_id, total_lines=8000, model="m"),
        BatchAssigned(aggregate_id=batch_id, executor_id="exec-1", attempt=1, lease_token="t"),
        BatchStarted(aggregate_id=batch_id, executor_id="exec-1", attempt=1, engine="llamacpp", engine_version="1"),
        *progress,
    ]


WINDOW = 20_000
"""Publishes awaited at once: nats-py keeps at most 4,000 acks in flight, the rest wait for room."""
ACK_WAIT_S = 120.0


async def publish_payloads(bus: EventBus, payloads: Iterable[tuple[str, bytes]]) -> int:
    """Publish pipelined (`publish_async`, many acks in flight); every ack is awaited and any error raised."""
    pending: list[asyncio.Future[Any]] = []
    published = 0
    for subject, payload in payloads:
        pending.append(await bus.js.publish_async(subject, payload, stream=EVENTS_STREAM))
        published += 1
        if len(pending) >= WINDOW:
            await asyncio.wait_for(asyncio.gather(*pending), ACK_WAIT_S)
            pending = []
    await asyncio.wait_for(asyncio.gather(*pending), ACK_WAIT_S)
    return published


async def publish_facts(bus: EventBus, facts: list[Event]) -> int:
    return await publish_payloads(bus, ((fact.subject, fact.model_dump_json().encode()) for fact in facts))


async def publish(bus: EventBus, events: int, batches: int) -> int:
    per_batch = max(7, events // batches)
    published = 0
    for first in range(0, batches, ACTIVE):
        lives = [life(n, per_batch) for n in range(first, min(first + ACTIVE, batches))]
        published += await publish_facts(bus, [fact for step in zip(*lives, strict=True) for fact in step])
    return published


async def publish_open(bus: EventBus, batches: int, first_chunk: int, chunks: int) -> int:
    lives = [running(n, first_chunk, chunks) for n in range(batches)]
    return await publish_facts(bus, [fact for step in zip(*lives, strict=True) for fact in step])


async def raw_read(bus: EventBus, head: int) -> float:
    done = asyncio.Event()

    async def drop(message: Msg) -> None:
        if message.metadata.sequence.stream >= head:
            done.set()

    started = time.perf_counter()
    subscription = await bus.js.subscribe(EVENTS_SUBJECTS, stream=EVENTS_STREAM, ordered_consumer=True, cb=drop)
    await done.wait()
    elapsed = time.perf_counter() - started
    await subscription.unsubscribe()
    return elapsed


async def live_fold(connection: ConnectionSettings, db_path: Path) -> float:
    app = create_app(LedgerSettings(connection=connection, db_path=db_path))
    stop = asyncio.Event()
    started = time.perf_counter()
    task = asyncio.create_task(app.run(stop))
    await app.caught_up.wait()
    elapsed = time.perf_counter() - started
    stop.set()
    await task
    return elapsed


async def stream_size(bus: EventBus) -> tuple[int, int]:
    state = (await bus.js.stream_info(EVENTS_STREAM)).state
    return state.messages, state.bytes


def bucket_bytes(store: ObjectStore, prefix: str) -> int:
    return sum(obj.size or 0 for obj in store.client.list_objects(store.bucket, prefix=prefix, recursive=True))


def same_history(whole: Replayed, replayed: Replayed) -> None:
    """The two replays make the same records (the archived-point marker aside) and end on the same chain."""
    expected = {key: record for key, record in whole.records.items() if key != ARCHIVED_THROUGH_KEY}
    records = {key: record for key, record in replayed.records.items() if key != ARCHIVED_THROUGH_KEY}
    assert records.keys() == expected.keys(), ("the replays make different records",
                                               sorted(records.keys() ^ expected.keys())[:5])
    assert all(records[key].model_dump() == expected[key].model_dump() for key in records), "records differ"
    assert replayed.chain_head == whole.chain_head, "the replays end on different chains"


@contextlib.asynccontextmanager
async def servers(scratch: Path) -> AsyncIterator[tuple[ConnectionSettings, ObjectStore, int]]:
    """A fresh embedded nats-server and SeaweedFS under `scratch`: their connection, the bucket, nats-server's pid."""
    port, s3_port = free_port(), free_port()
    creds = S3Credentials.load_or_create(scratch / "s3-credentials.json")
    server = start_nats(scratch, port, scratch / "nats.log")
    seaweed = start_seaweed(scratch, s3_port, creds, scratch / "weed.log")
    connection = ConnectionSettings(nats_url=f"nats://127.0.0.1:{port}", s3_endpoint=f"127.0.0.1:{s3_port}",
                                    s3_access_key=creds.access_key, s3_secret_key=creds.secret_key,
                                    s3_bucket="bench")
    store = ObjectStore.from_settings(connection)
    try:
        await store.ensure_bucket()
        yield connection, store, server.pid
    finally:
        store.close()
        stop_process(seaweed)
        stop_process(server)


async def main(events: int, batches: int, open_batches: int, tail: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with servers(Path(tmp)) as (connection, store, _):
            bus = await EventBus.connect(connection.nats_url, "bench")
            started = time.perf_counter()
            ended = await publish(bus, events, batches)
            point = ended + await publish_open(bus, open_batches, 0, 2)
            head = point + await publish_open(bus, open_batches, 2, tail)
            print(f"published {head:,} events: {ended:,} of {batches:,} ended batches, {head - ended:,} of "
                  f"{open_batches:,} open ones ({head - point:,} after the archived point) in "
                  f"{time.perf_counter() - started:.1f}s", flush=True)
            raw = await raw_read(bus, head)
            live = await live_fold(connection, Path(tmp) / "ledger.sqlite")
            whole = await replay_into_scratch(bus)
            assert whole.events == head, (whole.events, head)
            before = await stream_size(bus)

            ledger = await asyncio.to_thread(Ledger, persistence_env(Path(tmp) / "ledger.sqlite"))
            archive = Archive(store)
            retention = Retention(bus, await ReadModel.open(bus), archive, ledger, Policy(window_s=0, period_s=0))
            started = time.perf_counter()
            archived = await retention.archive_through(point, None)
            archiving = time.perf_counter() - started
            await asyncio.to_thread(ledger.close)
            assert archived is not None and len(archived.kept) == open_batches, archived
            after = await stream_size(bus)
            sizes = [await asyncio.to_thread(bucket_bytes, store, prefix)
                     for prefix in (SEGMENTS_PREFIX, f"{ARCHIVE_PREFIX}snapshots/", BATCH_LOGS_PREFIX)]

            snapshot = await replay_into_scratch(bus, archive=archive)
            segments = await replay_into_scratch(bus, archive=archive, full=True)
            same_history(whole, snapshot)
            same_history(whole, segments)
            await bus.close()
    rows = [("raw ordered-consumer read", raw), ("live fold (SQLite + read model)", live),
            ("replay (scratch, no side effects)", whole.seconds)]
    print(f"\n{'run':36} {'seconds':>9} {'events/s':>11} {'vs raw':>8}")
    for name, seconds in rows:
        print(f"{name:36} {seconds:9.2f} {head / seconds:11,.0f} {raw / seconds:8.1%}")

    print(f"\nretention: {ended:,} facts of ended history, {open_batches:,} open batches, {head - point:,} facts after "
          f"the archived point {point:,}")
    print(f"{'replay':44} {'seconds':>9} {'facts folded':>13} {'aggregates':>11} {'vs before':>10}")
    for name, replayed, aggregates in (
            ("before: the whole stream from sequence 1", whole, 0),
            ("after: snapshot + live stream", snapshot, snapshot.seeded),
            ("after --full: every segment + live stream", segments, 0)):
        print(f"{name:44} {replayed.seconds:9.2f} {replayed.events:13,} {aggregates:11,} "
              f"{replayed.seconds / whole.seconds:10.1%}")
    print(f"{'retention round (segment, refold, snapshot, purge)':52} {archiving:9.2f}")

    print(f"\n{'size':44} {'bytes':>14} {'per 1M facts':>14}")
    for name, size, per in (("EVENTS before (all facts)", before[1], before[0]),
                            (f"EVENTS after ({after[0]:,} messages left)", after[1], head),
                            ("bucket: segment (gzip)", sizes[0], point),
                            (f"bucket: snapshot ({archived.aggregates:,} aggregates)", sizes[1], point),
                            ("bucket: archived batch logs (gzip)", sizes[2], ended)):
        print(f"{name:44} {size:14,} {size * 1_000_000 / max(per, 1):14,.0f}")


# Scaling: replay from the snapshot as ended history grows, built in retention rounds as a deployment builds it.

def life_payloads(n: int, events: int) -> list[tuple[str, bytes]]:
    """`life(n, events)` as published bytes; the progress facts from one template (exactly `model_dump_json`'s
    bytes, which the fold's fast path reads), so ten million cost seconds, not pydantic's minutes."""
    chunks = events - 6
    whole = life(n, 7)  # its progress fact is the template; the rest are `life(n, events)`'s but for the counts
    created, validated, assigned, started, first, finalizing, completed = whole
    validated = validated.model_copy(update={"total_lines": chunks * 8})
    completed = completed.model_copy(update={"completed": chunks * 8, "usage": BatchUsage(
        input_tokens=chunks * 80, output_tokens=chunks * 40, total_tokens=chunks * 120)})
    progress = first.model_dump(mode="json")
    batch_id = progress["aggregate_id"]
    steps = [{**progress, "event_id": f"{batch_id}:progressed:1:{c}", "chunk": c, "chunk_key": f"c{c}",
              "completed": 8 * (c + 1)} for c in range(chunks)]
    return [*((e.subject, e.model_dump_json().encode()) for e in (created, validated, assigned, started)),
            *((first.subject, orjson.dumps(step)) for step in steps),
            *((e.subject, e.model_dump_json().encode()) for e in (finalizing, completed))]


def ended_payloads(first: int, batches: int, events: int) -> Iterator[tuple[str, bytes]]:
    """Batches first.. first+batches-1, `events` facts each, ACTIVE at a time interleaved."""
    for start in range(first, first + batches, ACTIVE):
        lives = [life_payloads(n, events) for n in range(start, min(start + ACTIVE, first + batches))]
        for step in zip(*lives, strict=True):
            yield from step


@dataclass
class History:
    """What the scaling run has built so far."""

    ended_facts: int = 0
    ended_batches: int = 0
    open_chunk: int = 0
    """The open batches' next progress chunk."""
    rounds: int = 0
    publish_s: float = 0.0
    archive_s: float = 0.0
    latest: ArchivePoint | None = None


async def grow(bus: EventBus, retention: Retention, history: History, facts: int, batch_facts: int) -> None:
    """`facts` more facts of ended batches, then a retention round through the head: they leave the stream."""
    batches = max(1, facts // batch_facts)
    started = time.perf_counter()
    history.ended_facts += await publish_payloads(bus, ended_payloads(history.ended_batches, batches, batch_facts))
    history.ended_batches += batches
    history.publish_s += time.perf_counter() - started
    started = time.perf_counter()
    history.latest = await retention.archive_through(await eventlog.head(bus), history.latest)
    assert history.latest is not None
    history.archive_s += time.perf_counter() - started
    history.rounds += 1


@dataclass
class Measured:
    ended_facts: int
    ended_batches: int
    replays: list[Replayed]
    cpu_s: float
    """This process's CPU seconds in the fastest snapshot replay (nats-server's apart)."""
    snapshot_bytes: int
    in_stream: int
    full: Replayed | None


async def measure(bus: EventBus, archive: Archive, history: History, full: bool, repeats: int) -> Measured:
    """Snapshot + live replays (the fastest counts) and, with `full`, one from every segment; both must agree."""
    replays, cpu = [], []
    for _ in range(repeats):
        before = cpu_seconds(os.getpid())
        replays.append(await replay_into_scratch(bus, archive=archive))
        cpu.append(cpu_seconds(os.getpid()) - before)
    whole = await replay_into_scratch(bus, archive=archive, full=True) if full else None
    if whole is not None:
        for replayed in replays:
            same_history(whole, replayed)
    assert history.latest is not None
    size = await asyncio.to_thread(bucket_bytes, archive.store, snapshot_key(history.latest.index))
    fastest = min(range(repeats), key=lambda i: replays[i].seconds)
    return Measured(history.ended_facts, history.ended_batches, replays, cpu[fastest], size,
                    (await stream_size(bus))[0], whole)


async def scaling(sizes: list[int], batch_facts: int, open_batches: int, tail: int, round_facts: int,
                  full_upto: int, repeats: int) -> None:
    """For each size of ended history: grow it to that size (in retention rounds of at most `round_facts`), give
    the open batches `tail` more facts each (the live part), and replay from the snapshot."""
    scratch = Path(tempfile.mkdtemp(prefix="ledger-replay-", dir="/tmp"))
    results: list[Measured] = []
    try:
        async with servers(scratch) as (connection, store, _):
            bus = await EventBus.connect(connection.nats_url, "bench")
            archive = Archive(store)
            ledger = Ledger(persistence_env(None))
            retention = Retention(bus, await ReadModel.open(bus), archive, ledger, Policy(window_s=0, period_s=0))
            history = History(open_chunk=2)
            await publish_open(bus, open_batches, 0, 2)
            for size in sizes:
                while history.ended_facts < size:
                    await grow(bus, retention, history, min(round_facts, size - history.ended_facts), batch_facts)
                await publish_open(bus, open_batches, history.open_chunk, tail)
                history.open_chunk += tail
                results.append(await measure(bus, archive, history, size <= full_upto, repeats))
                report_row(results[-1], history)
            ledger.close()
            await bus.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report_scaling(results, open_batches, tail)


def report_row(m: Measured, history: History) -> None:
    print(f"  {m.ended_facts:,} ended facts ({history.rounds} rounds: publish {history.publish_s:.0f}s, archive "
          f"{history.archive_s:.0f}s so far): snapshot replays "
          f"{', '.join(f'{r.seconds:.2f}s' for r in m.replays)}"
          + (f", full {m.full.seconds:.1f}s" if m.full else ""), flush=True)


def report_scaling(results: list[Measured], open_batches: int, tail: int) -> None:
    print(f"\nsnapshot + live replay with {open_batches:,} open batches ({open_batches * tail:,} facts after the "
          "archived point), by ended history")
    print(f"{'ended facts':>12} {'batches':>8} {'in stream':>10} {'aggregates':>11} {'snapshot B':>11} "
          f"{'live facts':>10} {'replay s':>9} {'CPU s':>7} {'full replay s':>14}")
    for m in results:
        best = min(m.replays, key=lambda r: r.seconds)
        full = f"{m.full.seconds:14.1f}" if m.full else f"{'-':>14}"
        print(f"{m.ended_facts:12,} {m.ended_batches:8,} {m.in_stream:10,} {best.seeded:11,} {m.snapshot_bytes:11,} "
              f"{best.events:10,} {best.seconds:9.2f} {m.cpu_s:7.2f} {full}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=300_000, help="facts of ended batches")
    parser.add_argument("--batches", type=int, default=300, help="ended batches")
    parser.add_argument("--open", type=int, default=1000, help="batches still running")
    parser.add_argument("--tail", type=int, default=10, help="progress facts per open batch after the archived point")
    parser.add_argument("--sizes", type=str, default="",
                        help="comma-separated sizes of ended history (facts): the scaling run instead")
    parser.add_argument("--batch-facts", type=int, default=1000, help="facts per ended batch (scaling run)")
    parser.add_argument("--round", type=int, default=1_000_000, help="facts archived per retention round (scaling)")
    parser.add_argument("--full-upto", type=int, default=1_000_000,
                        help="also replay every segment (the reference) up to this size (scaling)")
    parser.add_argument("--repeats", type=int, default=2, help="snapshot replays per size (scaling)")
    args = parser.parse_args()
    if args.sizes:
        asyncio.run(scaling([int(size) for size in args.sizes.split(",")], args.batch_facts, args.open, args.tail,
                            args.round, args.full_upto, args.repeats))
    else:
        asyncio.run(main(args.events, args.batches, args.open, args.tail))
