"""Ledger fold and replay rates against the raw JetStream read rate, measured in the same run.

Usage: .venv/bin/python bench/ledger_replay.py [--events 1000000] [--batches 1000]
Publishes synthetic-but-valid batch lives into a fresh embedded nats-server, then times: an ordered consumer
that reads and drops every message (the baseline), the live ledger (SQLite store + KV read model) folding from
sequence 1 until caught up, and `replay` (scratch in-memory store, no side effects). Aim: replay ≥ 50% of raw.
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
from infra.embedded import free_port, start_nats, stop_process
from services.ledger.app import create_app
from services.ledger.replay import replay_into_scratch
from services.ledger.settings import LedgerSettings
from services.runtime.bus import EventBus
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


async def publish(bus: EventBus, events: int, batches: int) -> int:
    per_batch = max(7, events // batches)
    published = 0
    for first in range(0, batches, ACTIVE):
        lives = [life(n, per_batch) for n in range(first, min(first + ACTIVE, batches))]
        interleaved = [fact for step in zip(*lives, strict=True) for fact in step]
        for start in range(0, len(interleaved), 2000):
            window = interleaved[start:start + 2000]
            await asyncio.gather(*(bus.js.publish(f.subject, f.model_dump_json().encode(), stream=EVENTS_STREAM)
                                   for f in window))
            published += len(window)
    return published


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


async def live_fold(url: str, db_path: Path) -> float:
    app = create_app(LedgerSettings(connection=ConnectionSettings(nats_url=url), db_path=db_path))
    stop = asyncio.Event()
    started = time.perf_counter()
    task = asyncio.create_task(app.run(stop))
    await app.caught_up.wait()
    elapsed = time.perf_counter() - started
    stop.set()
    await task
    return elapsed


async def main(events: int, batches: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        server = start_nats(Path(tmp), port, Path(tmp) / "nats.log")
        url = f"nats://127.0.0.1:{port}"
        try:
            bus = await EventBus.connect(url, "bench")
            started = time.perf_counter()
            head = await publish(bus, events, batches)
            print(f"published {head:,} events for {batches:,} batches in {time.perf_counter() - started:.1f}s",
                  flush=True)
            raw = await raw_read(bus, head)
            live = await live_fold(url, Path(tmp) / "ledger.sqlite")
            replayed = await replay_into_scratch(bus)
            assert replayed.events == head, (replayed.events, head)
            await bus.close()
        finally:
            stop_process(server)
    rows = [("raw ordered-consumer read", raw), ("live fold (SQLite + read model)", live),
            ("replay (scratch, no side effects)", replayed.seconds)]
    print(f"\n{'run':36} {'seconds':>9} {'events/s':>11} {'vs raw':>8}")
    for name, seconds in rows:
        print(f"{name:36} {seconds:9.2f} {head / seconds:11,.0f} {raw / seconds:8.1%}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--batches", type=int, default=1000)
    args = parser.parse_args()
    asyncio.run(main(args.events, args.batches))
