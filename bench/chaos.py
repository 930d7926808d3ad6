"""Chaos benchmark: N batches run once undisturbed and once while random services (and the broker) are
SIGKILLed at random moments; prints lines lost and duplicated (goal 0 / 0) and time to completion for both.

With `--executors N` (N > 1) the fleet has N executors and every batch is split into shards across them; the
monkey also kills the extra executors (each comes back, as a supervisor would bring it back, a few seconds later).

Usage: .venv/bin/python bench/chaos.py [--batches 3] [--lines 16] [--kills 6] [--seed 1] [--executors 1]
"""

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import openai
from openai import OpenAI

from infra.embedded import free_port
from tests.e2e.conftest import ADMIN_KEY, RunningStack, start_stack, stop_stack
from tests.e2e.test_batch_lifecycle import long_lines, upload
from tests.e2e.test_fleet import CHAT, new_worker_key, start_executor

VICTIMS = ("executor", "scheduler", "ledger", "validator", "gateway", "nats")
TERMINAL = {"completed", "failed", "expired", "cancelled"}


def submit(client: OpenAI, tag: str, batches: int, lines: int) -> dict[str, list[str]]:
    submitted = {}
    for b in range(batches):
        ids = [f"{tag}-{b}-{i}" for i in range(lines)]
        batch = client.batches.create(input_file_id=upload(client, long_lines(ids)), endpoint="/v1/chat/completions",
                                      completion_window="24h")
        submitted[batch.id] = ids
    return submitted


def settle(client: OpenAI, submitted: dict[str, list[str]], timeout_s: float = 900) -> tuple[int, int, int]:
    """(lines lost, lines duplicated, batches not completed) once every batch is terminal."""
    deadline = time.monotonic() + timeout_s
    pending = set(submitted)
    finished = {}
    while pending and time.monotonic() < deadline:
        for batch_id in list(pending):
            try:
                batch = client.batches.retrieve(batch_id)
            except openai.APIError:
                continue  # the gateway or broker may be down for a moment
            if batch.status in TERMINAL:
                finished[batch_id] = batch
                pending.discard(batch_id)
        time.sleep(0.5)
    lost = duplicated = 0
    for batch_id, ids in submitted.items():
        seen: Counter[str] = Counter()
        ended = finished.get(batch_id)
        for file_id in (ended.output_file_id, ended.error_file_id) if ended else ():
            if file_id:
                seen.update(json.loads(line)["custom_id"] for line in client.files.content(file_id).text.splitlines())
        lost += sum(1 for custom_id in ids if seen[custom_id] == 0)
        duplicated += sum(count - 1 for count in seen.values() if count > 1)
    incomplete = sum(1 for b in submitted if b not in finished or finished[b].status != "completed")
    return lost, duplicated, incomplete


class ExtraExecutors:
    """Executors beyond the stack's own, restarted a little after they are killed."""

    def __init__(self, stack: RunningStack, count: int) -> None:
        self.stack = stack
        self.keys = {f"extra-{n}": new_worker_key(stack, f"extra-{n}") for n in range(1, count)}
        self.processes = {name: self._start(name) for name in self.keys}

    def _start(self, name: str) -> subprocess.Popen:
        return start_executor(self.stack, name, budget_mb=4096, preload=[CHAT], worker_key=self.keys[name])

    def kill(self, name: str) -> None:
        self.processes[name].kill()
        self.processes[name].wait()
        time.sleep(2)
        self.processes[name] = self._start(name)

    def stop(self) -> None:
        for process in self.processes.values():
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def chaos_monkey(stack: RunningStack, extras: ExtraExecutors, kills: int, rng: random.Random, log: list[str],
                 stop: threading.Event) -> None:
    for _ in range(kills):
        if stop.wait(rng.uniform(3, 8)):
            return
        victim = rng.choice(VICTIMS + tuple(extras.processes))
        try:
            if victim in extras.processes:
                extras.kill(victim)
            else:
                os.kill(stack.service_pid(victim), signal.SIGKILL)
            log.append(victim)
        except (OSError, ValueError):
            pass


def run(stack: RunningStack, extras: ExtraExecutors, tag: str, args: argparse.Namespace,
        kills: int) -> tuple[float, int, int, int, list[str]]:
    client = OpenAI(base_url=stack.base_url, api_key=ADMIN_KEY, max_retries=8, timeout=60)
    killed: list[str] = []
    stop = threading.Event()
    started = time.perf_counter()
    submitted = submit(client, tag, args.batches, args.lines)
    monkey = threading.Thread(target=chaos_monkey, args=(stack, extras, kills, random.Random(args.seed), killed, stop))
    monkey.start()
    lost, duplicated, incomplete = settle(client, submitted)
    stop.set()
    monkey.join()
    return time.perf_counter() - started, lost, duplicated, incomplete, killed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--lines", type=int, default=16)
    parser.add_argument("--kills", type=int, default=6)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--executors", type=int, default=1, help="executors in the fleet; >1 shards every batch")
    parser.add_argument("--keep", type=Path, default=None, help="keep the stack's data and logs in this directory")
    args = parser.parse_args()
    sharding = {"SHESHNAG_SCHEDULER_SHARD_MIN_LINES": str(max(1, args.lines // args.executors)),
                "SHESHNAG_EXECUTOR_CHUNK_LINES": "4"} if args.executors > 1 else {}
    with tempfile.TemporaryDirectory() as tmp:
        base = args.keep or Path(tmp)
        base.mkdir(parents=True, exist_ok=True)
        stack = start_stack(base / "data", free_port(), sharding)
        extras = ExtraExecutors(stack, args.executors)
        try:
            time.sleep(15 if args.executors > 1 else 0)  # the extra executors load the model and register
            calm = run(stack, extras, "calm", args, kills=0)
            chaos = run(stack, extras, "chaos", args, kills=args.kills)
        finally:
            extras.stop()
            stop_stack(stack)
    print(f"\n{args.batches} batches x {args.lines} lines (max_tokens 64), {args.executors} executor(s)\n")
    print("| run | seconds | lines lost | lines duplicated | batches not completed | kills |")
    print("|---|---|---|---|---|---|")
    for name, (seconds, lost, duplicated, incomplete, killed) in (("undisturbed", calm), ("chaos", chaos)):
        print(f"| {name} | {seconds:.1f} | {lost} | {duplicated} | {incomplete} | {', '.join(killed) or '-'} |")
    print(f"\nslowdown under chaos: {chaos[0] / calm[0]:.2f}x")


if __name__ == "__main__":
    main()
