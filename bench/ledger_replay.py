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
"""

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nats.aio.msg import Msg

from contracts.api.batch import BatchUsage
from contracts.archive import ARCHIVE_PREFIX, ARCHIVED_THROUGH_KEY, BATCH_LOGS_PREFIX, SEGMENTS_PREFIX
from contracts.events.batch import (
    BatchAssigned,
    BatchCompleted,
    BatchCreated,
    BatchFinalizing,
    BatchProgressed,
    BatchStarted,
    BatchValidated,
)
from contracts.events.envelope import Event
from contracts.subjects import EVENTS_STREAM, EVENTS_SUBJECTS
from infra.embedded import S3Credentials, free_port, start_nats, start_seaweed, stop_process
from services.ledger.app import create_app
from services.ledger.application import Ledger, persistence_env
from services.ledger.archive import Archive
from services.ledger.replay import Replayed, replay_into_scratch
from services.ledger.retention import Policy, Retention
from services.ledger.settings import LedgerSettings
from services.runtime.bus import EventBus
from services.runtime.objectstore import ObjectStore
from services.runtime.readmodel import ReadModel
from services.runtime.settings import ConnectionSettings

ACTIVE = 10
"""Batches running at once: their facts interleave in the stream."""


def life(n: int, events: int) -> list[Event]:
    """One batch from creation to completion in exactly `events` facts (at least 7)."""
    batch_id, chunks = f"batch_bench{n:06d}", events - 6
    return [
        BatchCreated(aggregate_id=batch_id, owner_key_id="key_bench", input_file_id=f"file-{n}",
                     input_object_key=f"files/file-{n}", endpoint="/v1/chat/completions", completion_window="24h",
                     created_at=1_700_000_000, expires_at=1_700_086_400),
        BatchValidated(aggregate_id=batch_id, total_lines=chunks * 8, model="m", owner_key_id="key_bench",
                       endpoint="/v1/chat/completions", input_object_key=f"files/file-{n}"),
        BatchAssigned(aggregate_id=batch_id, executor_id="exec-1", attempt=1, lease_token="t"),
        BatchStarted(aggregate_id=batch_id, executor_id="exec-1", attempt=1, engine="llamacpp", engine_version="1"),
        *(BatchProgressed(aggregate_id=batch_id, attempt=1, chunk=c, chunk_key=f"c{c}", completed=8 * (c + 1),
                          failed=0) for c in range(chunks)),
        BatchFinalizing(aggregate_id=batch_id, attempt=1),
        BatchCompleted(aggregate_id=batch_id, output_file_id=f"out-{n}", error_file_id=None, completed=chunks * 8,
                       failed=0, usage=BatchUsage(input_tokens=chunks * 80, output_tokens=chunks * 40,
                                                  total_tokens=chunks * 120)),
    ]


def running(n: int, first_chunk: int, chunks: int) -> list[Event]:
    """An open batch: its start (with `first_chunk` 0), then progress chunks; it never ends."""
    batch_id = f"batch_open{n:06d}"
    progress: list[Event] = [
        BatchProgressed(aggregate_id=batch_id, attempt=1, chunk=c, chunk_key=f"c{c}", completed=8 * (c + 1), failed=0)
        for c in range(first_chunk, first_chunk + chunks)]
    if first_chunk:
        return progress
    return [
        BatchCreated(aggregate_id=batch_id, owner_key_id="key_bench", input_file_id=f"file-open-{n}",
                     input_object_key=f"files/file-open-{n}", endpoint="/v1/chat/completions",
                     completion_window="24h", created_at=1_700_000_000, expires_at=1_700_086_400),
        BatchValidated(aggregate_id=batch_id, total_lines=8000, model="m", owner_key_id="key_bench",
                       endpoint="/v1/chat/completions", input_object_key=f"files/file-open-{n}"),
        BatchAssigned(aggregate_id=batch_id, executor_id="exec-1", attempt=1, lease_token="t"),
        BatchStarted(aggregate_id=batch_id, executor_id="exec-1", attempt=1, engine="llamacpp", engine_version="1"),
        *progress,
    ]


async def publish_facts(bus: EventBus, facts: list[Event]) -> int:
    for start in range(0, len(facts), 2000):
        window = facts[start:start + 2000]
        await asyncio.gather(*(bus.js.publish(f.subject, f.model_dump_json().encode(), stream=EVENTS_STREAM)
                               for f in window))
    return len(facts)


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
    records = {key: record for key, record in replayed.records.items() if key != ARCHIVED_THROUGH_KEY}
    assert records.keys() == whole.records.keys(), "the replays make different records"
    assert all(records[key].model_dump() == whole.records[key].model_dump() for key in records), "records differ"
    assert replayed.chain_head == whole.chain_head, "the replays end on different chains"


async def main(events: int, batches: int, open_batches: int, tail: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        port, s3_port = free_port(), free_port()
        creds = S3Credentials.load_or_create(Path(tmp) / "s3-credentials.json")
        server = start_nats(Path(tmp), port, Path(tmp) / "nats.log")
        seaweed = start_seaweed(Path(tmp), s3_port, creds, Path(tmp) / "weed.log")
        connection = ConnectionSettings(nats_url=f"nats://127.0.0.1:{port}", s3_endpoint=f"127.0.0.1:{s3_port}",
                                        s3_access_key=creds.access_key, s3_secret_key=creds.secret_key,
                                        s3_bucket="bench")
        store = ObjectStore.from_settings(connection)
        try:
            await store.ensure_bucket()
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
        finally:
            store.close()
            stop_process(seaweed)
            stop_process(server)
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


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=300_000, help="facts of ended batches")
    parser.add_argument("--batches", type=int, default=300, help="ended batches")
    parser.add_argument("--open", type=int, default=1000, help="batches still running")
    parser.add_argument("--tail", type=int, default=10, help="progress facts per open batch after the archived point")
    args = parser.parse_args()
    asyncio.run(main(args.events, args.batches, args.open, args.tail))
