"""Soak benchmark: a stack under dashboard-like use for a while, sampled at start, middle and end.

The load (tests/e2e/load.py): 10 clients polling lists, retrieves, the overview and the fleet; 200 SSE streams
opened and dropped abruptly per wave; 50 concurrent uploads per wave; a stream of small batches (some cancelled);
one large batch. Per process it samples open fds, threads and RSS, and the broker's consumers per stream and its
connections; the goal is flat (no growth past warm-up), 0 5xx, 0 short lists, every batch terminal with every line
exactly once. The start sample is the baseline of the same run.

Usage: .venv/bin/python bench/soak.py [--minutes 20] [--big-lines 20000] [--seed 1] [--keep DIR]
"""

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp

from infra.embedded import free_port
from tests.e2e.conftest import start_stack, stop_stack
from tests.e2e.load import SERVICES, STREAMS, Load, Sample, chat_lines, sample

STACK_ENV = {
    "SHESHNAG_GATEWAY_CONTROL_CALLS_PER_S": "1000", "SHESHNAG_GATEWAY_CONTROL_CALL_BURST": "10000",
    "SHESHNAG_GATEWAY_MAX_ACTIVE_BATCHES": "10000",
}


async def waves(load: Load, stop: float, rng: random.Random, stats: dict[str, int]) -> None:
    """Every ~30 s: 200 SSE streams dropped, 50 uploads at once, 3 small batches (one cancelled at once)."""
    wave = 0
    while time.monotonic() < stop:
        wave += 1
        if load.batches:
            targets = [rng.choice(list(load.batches)) for _ in range(200)]
            await asyncio.gather(*(load.drop_sse(b) for b in targets), return_exceptions=True)
            stats["sse_dropped"] += 200
        uploads = await asyncio.gather(*(load.upload(chat_lines(f"w{wave}-u{i}", 200)) for i in range(50)))
        stats["uploads"] += sum(1 for u in uploads if u)
        for i in range(3):
            batch_id = await load.create_batch(f"w{wave}-b{i}", 3)
            stats["batches"] += 1
            if batch_id and i == 2:
                await load.call("POST", f"/v1/batches/{batch_id}/cancel")
                stats["cancels"] += 1
        await asyncio.sleep(max(0.0, min(30.0, stop - time.monotonic())))


async def pollers(load: Load, stop: float, rng: random.Random, stats: dict[str, int]) -> None:
    async def one() -> None:
        while time.monotonic() < stop:
            await load.poll(1, rng)
            stats["poll_rounds"] += 1
            await asyncio.sleep(rng.uniform(0.5, 1.5))
    await asyncio.gather(*(one() for _ in range(10)))


def table(samples: list[tuple[str, Sample]]) -> str:
    heads = [label for label, _ in samples]
    rows = ["| what | " + " | ".join(heads) + " |", "|---|" + "---|" * len(heads)]
    for name in SERVICES:
        rows.append(f"| {name} fds / threads / RSS MB | " + " | ".join(
            f"{s.processes[name][0]} / {s.processes[name][1]} / {s.processes[name][2]:.0f}" for _, s in samples) + " |")
    for stream in STREAMS:
        rows.append(f"| consumers on {stream} | " + " | ".join(str(s.consumers[stream]) for _, s in samples) + " |")
    rows.append("| NATS connections | " + " | ".join(str(s.nats_connections) for _, s in samples) + " |")
    return "\n".join(rows)


async def soak(args: argparse.Namespace, data_dir: Path) -> int:
    stack = start_stack(data_dir, free_port(), STACK_ENV)
    rng = random.Random(args.seed)
    stats = dict.fromkeys(("sse_dropped", "uploads", "batches", "cancels", "poll_rounds"), 0)
    try:
        connector = aiohttp.TCPConnector(limit=128)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:
            load = Load(stack, session)
            warm = await load.create_batch("warm-up", 2)
            assert warm and await load.until_ended(warm) == "completed"
            samples = [("start", await sample(stack))]
            print(table(samples), flush=True)
            big = await load.create_batch("big", args.big_lines, max_tokens=2)
            started = time.monotonic()
            stop = started + args.minutes * 60
            work = asyncio.gather(waves(load, stop, rng, stats), pollers(load, stop, rng, stats))
            await asyncio.sleep(args.minutes * 30)
            samples.append(("middle", await sample(stack)))
            print(table(samples), flush=True)
            await work
            samples.append(("end of load", await sample(stack)))
            print(table(samples), f"\nproblems so far: {load.problems[:5]}", flush=True)
            ended = [await load.until_ended(b, timeout_s=1800 if b == big else 120) for b in list(load.batches)]
            lost, duplicated, open_batches = await load.every_line_once()
            await asyncio.sleep(10)
            samples.append(("idle after", await sample(stack)))
    finally:
        stop_stack(stack)
    fivexx = sum(count for status, count in load.statuses.items() if status >= 500)
    print(f"\nSoak: {args.minutes} min of load, then every batch to its end "
          f"({time.monotonic() - started:.0f} s in all); {sum(load.statuses.values())} requests, "
          f"{stats['poll_rounds']} poll rounds, {stats['sse_dropped']} SSE streams dropped, {stats['uploads']} "
          f"uploads, {stats['batches']} small batches ({stats['cancels']} cancelled), one of {args.big_lines} lines\n")
    print(table(samples))
    print(f"\n5xx: {fivexx}; short lists: {load.short_lists}; batches not terminal: {open_batches} "
          f"(statuses: {dict(sorted((s, ended.count(s)) for s in set(ended)))}); lines lost: {lost}; "
          f"duplicated: {duplicated}")
    for problem in load.problems[:20]:
        print("  problem:", problem)
    return 0 if fivexx == lost == duplicated == open_batches == load.short_lists == 0 else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=20)
    parser.add_argument("--big-lines", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", type=Path, help="keep the stack's data dir (logs) here")
    args = parser.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        sys.exit(asyncio.run(soak(args, args.keep / "data")))
    with tempfile.TemporaryDirectory() as scratch:
        sys.exit(asyncio.run(soak(args, Path(scratch) / "data")))


if __name__ == "__main__":
    main()
