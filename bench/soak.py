"""Soak benchmark: a stack under dashboard-like use for a while, sampled at start, middle and end.

The load (tests/e2e/load.py): 10 clients polling lists, retrieves, the overview and the fleet; 200 SSE streams
opened and dropped abruptly per wave; 50 concurrent uploads per wave; a stream of small batches (some cancelled);
one large batch. Per process it samples open fds, threads and RSS, and the broker's consumers per stream and its
connections; the goal is flat (no growth past warm-up), 0 5xx, 0 short lists, every batch terminal with every line
exactly once. The start sample is the baseline of the same run. Every `--sample-every` seconds (60) each process's
RSS is sampled too, so a growth shows whether it levels off and where.

`--tracemalloc`: the gateway traces its allocations (`SHESHNAG_TRACEMALLOC=1`) and is sent SIGUSR2 after the warm-up,
at quiet points during the load (every `--heap-every` minutes, by default at the middle: the load pauses, its
requests in flight end, then the report is taken and the load goes on) and once idle after the load: its log's heap
reports (printed at the end) say what grew between two quiet points, by traceback, with the RSS beside the traced
memory; what grows between every two and stays once idle is what to fix, and an RSS that grows while the traced
memory does not is the allocator keeping peaks.

Usage: .venv/bin/python bench/soak.py [--minutes 20] [--big-lines 20000] [--seed 1] [--keep DIR] [--sample-every 60]
       [--tracemalloc] [--heap-every MINUTES]
"""

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp
import psutil

from infra.embedded import free_port
from tests.e2e.conftest import RunningStack, start_stack, stop_stack
from tests.e2e.load import SERVICES, STREAMS, Load, Sample, chat_lines, sample

STACK_ENV = {
    "SHESHNAG_GATEWAY_CONTROL_CALLS_PER_S": "1000", "SHESHNAG_GATEWAY_CONTROL_CALL_BURST": "10000",
    "SHESHNAG_GATEWAY_MAX_ACTIVE_BATCHES": "10000",
}


class Pauses:
    """The load's steps (a wave, a poll round) run unless the load is paused; a pause waits for those in flight."""

    def __init__(self) -> None:
        self.running = asyncio.Event()
        self.running.set()
        self.in_flight = 0
        self.quiet = asyncio.Event()
        self.quiet.set()

    @contextlib.asynccontextmanager
    async def step(self) -> AsyncIterator[None]:
        await self.running.wait()
        self.in_flight += 1
        self.quiet.clear()
        try:
            yield
        finally:
            self.in_flight -= 1
            if not self.in_flight:
                self.quiet.set()

    @contextlib.asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        self.running.clear()
        try:
            await self.quiet.wait()
            yield
        finally:
            self.running.set()


async def waves(load: Load, stop: float, rng: random.Random, stats: dict[str, int], pauses: Pauses) -> None:
    """Every ~30 s: 200 SSE streams dropped, 50 uploads at once, 3 small batches (one cancelled at once)."""
    wave = 0
    while time.monotonic() < stop:
        async with pauses.step():
            wave += 1
            try:
                await one_wave(load, wave, rng, stats)
            except (aiohttp.ClientError, TimeoutError) as error:
                unanswered(load, stats, [error])
        await asyncio.sleep(max(0.0, min(30.0, stop - time.monotonic())))


async def one_wave(load: Load, wave: int, rng: random.Random, stats: dict[str, int]) -> None:
    if load.batches:
        targets = [rng.choice(list(load.batches)) for _ in range(200)]
        await asyncio.gather(*(load.drop_sse(b) for b in targets), return_exceptions=True)
        stats["sse_dropped"] += 200
    uploads = await asyncio.gather(*(load.upload(chat_lines(f"w{wave}-u{i}", 200)) for i in range(50)),
                                   return_exceptions=True)
    stats["uploads"] += sum(1 for u in uploads if isinstance(u, str))
    unanswered(load, stats, [u for u in uploads if isinstance(u, BaseException)])
    for i in range(3):
        batch_id = await load.create_batch(f"w{wave}-b{i}", 3)
        stats["batches"] += 1
        if batch_id and i == 2:
            await load.call("POST", f"/v1/batches/{batch_id}/cancel")
            stats["cancels"] += 1


def unanswered(load: Load, stats: dict[str, int], errors: list[BaseException]) -> None:
    """Requests that got no answer (the client's timeout, a dropped connection): counted as problems, the soak goes
    on (a gateway too slow to answer in `ClientTimeout` is a finding, not the end of the run)."""
    stats["unanswered"] += len(errors)
    load.problems.extend(f"no answer: {error!r}" for error in errors)
    for error in errors:
        if not isinstance(error, (aiohttp.ClientError, TimeoutError)):
            raise error


async def pollers(load: Load, stop: float, rng: random.Random, stats: dict[str, int], pauses: Pauses) -> None:
    async def one() -> None:
        while time.monotonic() < stop:
            async with pauses.step():
                try:
                    await load.poll(1, rng)
                except (aiohttp.ClientError, TimeoutError) as error:
                    unanswered(load, stats, [error])
            stats["poll_rounds"] += 1
            await asyncio.sleep(rng.uniform(0.5, 1.5))
    await asyncio.gather(*(one() for _ in range(10)))


def rss_mb(stack: RunningStack) -> dict[str, float]:
    sizes = {}
    for name in SERVICES:
        try:
            sizes[name] = psutil.Process(stack.service_pid(name)).memory_info().rss / 2**20
        except (OSError, psutil.Error, ValueError):
            sizes[name] = -1.0
    return sizes


async def sample_rss(stack: RunningStack, every_s: float, rows: list[tuple[float, dict[str, float]]]) -> None:
    """Each process's RSS every `every_s` until cancelled, printed as it is taken."""
    started = time.monotonic()
    while True:
        rows.append((time.monotonic() - started, await asyncio.to_thread(rss_mb, stack)))
        print(f"RSS at {rows[-1][0] / 60:5.1f} min: " + ", ".join(f"{n} {mb:.0f}" for n, mb in rows[-1][1].items()),
              flush=True)
        await asyncio.sleep(every_s)


def rss_table(rows: list[tuple[float, dict[str, float]]]) -> str:
    lines = ["| min | " + " | ".join(f"{name} MB" for name in SERVICES) + " |", "|---|" + "---|" * len(SERVICES)]
    lines += [f"| {at / 60:.1f} | " + " | ".join(f"{sizes[n]:.1f}" for n in SERVICES) + " |" for at, sizes in rows]
    return "\n".join(lines)


async def heap_report(stack: RunningStack, why: str) -> None:
    """Ask the gateway (traced) for a heap report, and give it time to log it."""
    print(f"heap report requested: {why} (gateway RSS {rss_mb(stack)['gateway']:.1f} MB)", flush=True)
    os.kill(stack.service_pid("gateway"), signal.SIGUSR2)
    await asyncio.sleep(15)


async def quiet_reports(stack: RunningStack, pauses: Pauses, started: float, every_s: float) -> None:
    """Every `every_s` of load: pause it, let what is in flight end (and settle 5 s), take a heap report, go on."""
    while True:
        await asyncio.sleep(every_s)
        async with pauses.paused():
            await asyncio.sleep(5)
            await heap_report(stack, f"quiet point at {(time.monotonic() - started) / 60:.1f} min of load")


def heap_reports(stack: RunningStack) -> list[str]:
    reports = []
    for line in stack.log("gateway").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and str(record.get("message", record.get("msg", ""))).startswith("heap:"):
            reports.append(str(record.get("message", record.get("msg"))))
    return reports


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
    stack = start_stack(data_dir, free_port(), {**STACK_ENV, **({"SHESHNAG_TRACEMALLOC": "1"} if args.tracemalloc
                                                                 else {})})
    rss_rows: list[tuple[float, dict[str, float]]] = []
    reports: list[str] = []
    rng = random.Random(args.seed)
    stats = dict.fromkeys(("sse_dropped", "uploads", "batches", "cancels", "poll_rounds", "unanswered"), 0)
    try:
        connector = aiohttp.TCPConnector(limit=128)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:
            load = Load(stack, session)
            warm = await load.create_batch("warm-up", 2)
            assert warm and await load.until_ended(warm) == "completed"
            samples = [("start", await sample(stack))]
            print(table(samples), flush=True)
            if args.tracemalloc:
                await heap_report(stack, "after the warm-up")
            rss = asyncio.create_task(sample_rss(stack, args.sample_every, rss_rows))
            big = await load.create_batch("big", args.big_lines, max_tokens=2)
            started = time.monotonic()
            stop = started + args.minutes * 60
            pauses = Pauses()
            work = asyncio.gather(waves(load, stop, rng, stats, pauses), pollers(load, stop, rng, stats, pauses))
            quiet = asyncio.create_task(quiet_reports(stack, pauses, started, (args.heap_every or args.minutes / 2)
                                                      * 60)) if args.tracemalloc else None
            await asyncio.sleep(args.minutes * 30)
            samples.append(("middle", await sample(stack)))
            print(table(samples), flush=True)
            await work
            if quiet is not None:
                quiet.cancel()
            samples.append(("end of load", await sample(stack)))
            print(table(samples), f"\nproblems so far: {load.problems[:5]}", flush=True)
            ended = [await load.until_ended(b, timeout_s=1800 if b == big else 120) for b in list(load.batches)]
            lost, duplicated, open_batches = await load.every_line_once()
            await asyncio.sleep(10)
            samples.append(("idle after", await sample(stack)))
            if args.tracemalloc:
                await heap_report(stack, "idle after the load")
                reports = heap_reports(stack)
            rss.cancel()
            rss_rows.append((time.monotonic() - started, await asyncio.to_thread(rss_mb, stack)))
    finally:
        stop_stack(stack)
    fivexx = sum(count for status, count in load.statuses.items() if status >= 500)
    print(f"\nSoak: {args.minutes} min of load, then every batch to its end "
          f"({time.monotonic() - started:.0f} s in all); {sum(load.statuses.values())} requests, "
          f"{stats['poll_rounds']} poll rounds, {stats['sse_dropped']} SSE streams dropped, {stats['uploads']} "
          f"uploads, {stats['batches']} small batches ({stats['cancels']} cancelled), one of {args.big_lines} lines\n")
    print(table(samples))
    print(f"\nRSS every {args.sample_every:.0f} s (from the start of the load):\n{rss_table(rss_rows)}")
    for report in reports:
        print(f"\n{report}")
    print(f"\n5xx: {fivexx}; unanswered: {stats['unanswered']}; short lists: {load.short_lists}; batches not terminal: "
          f"{open_batches} "
          f"(statuses: {dict(sorted((s, ended.count(s)) for s in set(ended)))}); lines lost: {lost}; "
          f"duplicated: {duplicated}")
    for problem in load.problems[:20]:
        print("  problem:", problem)
    return 0 if fivexx == lost == duplicated == open_batches == load.short_lists == stats["unanswered"] == 0 else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=20)
    parser.add_argument("--big-lines", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", type=Path, help="keep the stack's data dir (logs) here")
    parser.add_argument("--sample-every", type=float, default=60.0, help="seconds between RSS samples")
    parser.add_argument("--tracemalloc", action="store_true", help="heap reports of the gateway (tracemalloc)")
    parser.add_argument("--heap-every", type=float, help="minutes between quiet points with a heap report "
                        "(--tracemalloc; default: half the load)")
    args = parser.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        sys.exit(asyncio.run(soak(args, args.keep / "data")))
    with tempfile.TemporaryDirectory() as scratch:
        sys.exit(asyncio.run(soak(args, Path(scratch) / "data")))


if __name__ == "__main__":
    main()
