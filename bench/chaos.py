"""Chaos benchmark: N batches of several owners, interleaved, run once undisturbed and once while random services
(and the broker) are SIGKILLed at random moments and executors are paused (SIGSTOP past their lease, then SIGCONT,
as a GC stall, a VM migration or a partition does) with new batches sent after each pause; prints lines lost and
duplicated over all batches (goal 0 / 0), batches not completed and time to completion for both.

The batches go round-robin to `--owners` users (an API key each), so the fleet runs units of several owners' batches
at once, in fair turns; units are `--unit-lines` lines, committed in chunks of 2. With `--executors N` (N > 1) the
fleet has N executors and every batch spreads over them; the monkey also kills and pauses the extra executors (a
killed one comes back, as a supervisor would bring it back, a few seconds later). `--executor-ttl-s` shortens the
executors' broker admission so that they renew it meanwhile.

Usage: .venv/bin/python bench/chaos.py [--batches 3] [--owners 3] [--lines 16] [--unit-lines 4] [--kills 6]
                                       [--pauses 1] [--seed 1] [--executors 1] [--pause-s 20] [--executor-ttl-s S]
                                       [--keep DIR]
"""

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import openai
from openai import OpenAI
from openai.types import Batch

from contracts.lifecycle import TERMINAL
from infra.embedded import free_port
from tests.e2e.conftest import RunningStack, start_stack, stop_stack
from tests.e2e.sharing import user_client
from tests.e2e.test_fleet import CHAT, new_worker_key, start_executor
from tests.factories import custom_ids_seen, long_lines, lost_and_duplicated, upload

VICTIMS = ("executor", "scheduler", "ledger", "validator", "gateway", "nats")
BATCHES_AFTER_PAUSE = 1


Submitted = dict[str, tuple[OpenAI, list[str]]]
"""Batch id → its owner's client and the custom_ids of its lines."""


def owners(stack: RunningStack, count: int) -> list[OpenAI]:
    """A client per owner: users of their own, each with an API key, made before any fault."""
    clients = [user_client(stack, f"chaos-owner-{n}") for n in range(count)]
    return [OpenAI(base_url=stack.base_url, api_key=client.api_key, max_retries=8, timeout=60) for client in clients]


def submit(clients: list[OpenAI], tag: str, batches: int, lines: int) -> Submitted:
    """Batches sent in turn by each owner (b0 by the first, b1 by the second, …), so they run interleaved."""
    submitted = {}
    for b in range(batches):
        client = clients[b % len(clients)]
        ids = [f"{tag}-{b}-{i}" for i in range(lines)]
        batch = client.batches.create(input_file_id=upload(client, long_lines(ids)), endpoint="/v1/chat/completions",
                                      completion_window="24h")
        submitted[batch.id] = (client, ids)
    return submitted


def settle(submitted: Submitted, more_coming: Callable[[], bool], timeout_s: float = 900) -> tuple[int, int, int]:
    """(lines lost, lines duplicated, batches not completed) over every batch of every owner, once every batch is
    terminal and no more are coming."""
    deadline = time.monotonic() + timeout_s
    finished: dict[str, Batch] = {}
    while time.monotonic() < deadline:
        coming = more_coming()  # read before the batches: one sent meanwhile is then seen below
        pending = set(submitted) - set(finished)
        if not pending and not coming:
            break
        for batch_id in pending:
            try:
                batch = submitted[batch_id][0].batches.retrieve(batch_id)
            except openai.APIError:
                continue  # the gateway or broker may be down for a moment
            if batch.status in TERMINAL:
                finished[batch_id] = batch
        time.sleep(0.5)
    lost = duplicated = 0
    for batch_id, (client, ids) in list(submitted.items()):
        ended = finished.get(batch_id)
        missing, extra = lost_and_duplicated(ids, custom_ids_seen(client, ended) if ended else Counter())
        lost, duplicated = lost + missing, duplicated + extra
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

    def pid(self, name: str) -> int:
        return self.processes[name].pid

    def stop(self) -> None:
        for process in self.processes.values():
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


class ChaosMonkey:
    """Kills random services and pauses random executors, one fault at a time, at random moments; after each
    pause it sends new batches, which must run on the executor that came back as on any other."""

    def __init__(self, stack: RunningStack, extras: ExtraExecutors, clients: list[OpenAI], submitted: Submitted,
                 args: argparse.Namespace, kills: int, pauses: int) -> None:
        self.stack, self.extras, self.clients, self.submitted, self.args = stack, extras, clients, submitted, args
        self.rng = random.Random(args.seed)
        self.faults = ["kill"] * kills + ["pause"] * pauses
        self.rng.shuffle(self.faults)
        self.pauses_left = pauses
        self.log: list[str] = []

    def run(self, stop: threading.Event) -> None:
        for fault in self.faults:
            if stop.wait(self.rng.uniform(3, 8)):
                return
            try:
                if fault == "pause":
                    self.pause(stop)
                else:
                    self.kill()
            except (OSError, ValueError):
                pass

    def kill(self) -> None:
        victim = self.rng.choice(VICTIMS + tuple(self.extras.processes))
        if victim in self.extras.processes:
            self.extras.kill(victim)
        else:
            os.kill(self.stack.service_pid(victim), signal.SIGKILL)
        self.log.append(victim)

    def pause(self, stop: threading.Event) -> None:
        victim = self.rng.choice(("executor", *self.extras.processes))
        pid = self.extras.pid(victim) if victim in self.extras.processes else self.stack.service_pid("executor")
        try:
            os.kill(pid, signal.SIGSTOP)
            stop.wait(self.args.pause_s)
            os.kill(pid, signal.SIGCONT)
            self.log.append(f"{victim} paused {self.args.pause_s:.0f}s")
            batches = submit(self.clients, f"after-pause-{len(self.log)}", BATCHES_AFTER_PAUSE, self.args.lines)
            self.submitted.update(batches)
        finally:
            self.pauses_left -= 1


def run(stack: RunningStack, extras: ExtraExecutors, clients: list[OpenAI], tag: str, args: argparse.Namespace,
        kills: int, pauses: int) -> tuple[float, int, int, int, list[str]]:
    """Undisturbed (no faults), the batches the chaos run sends after its pauses are sent at once with the rest."""
    stop = threading.Event()
    started = time.perf_counter()
    later = args.pauses * BATCHES_AFTER_PAUSE if pauses == 0 else 0
    submitted = submit(clients, tag, args.batches + later, args.lines)
    monkey = ChaosMonkey(stack, extras, clients, submitted, args, kills, pauses)
    thread = threading.Thread(target=monkey.run, args=(stop,))
    thread.start()
    lost, duplicated, incomplete = settle(submitted, lambda: monkey.pauses_left > 0)
    stop.set()
    thread.join()
    return time.perf_counter() - started, lost, duplicated, incomplete, monkey.log


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--owners", type=int, default=3, help="users the batches go to in turn (an API key each)")
    parser.add_argument("--lines", type=int, default=16)
    parser.add_argument("--unit-lines", type=int, default=4, help="lines per unit of work the scheduler hands out")
    parser.add_argument("--kills", type=int, default=6)
    parser.add_argument("--pauses", type=int, default=1, help="executor pauses (SIGSTOP, then SIGCONT) among faults")
    parser.add_argument("--pause-s", type=float, default=20.0,
                        help="how long a pause lasts: past the scheduler's 15 s lease, so the executor is lost")
    parser.add_argument("--executor-ttl-s", type=float, default=None,
                        help="executors' broker admission (SHESHNAG_NATS_EXECUTOR_TTL_S; default 1 h)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--executors", type=int, default=1, help="executors in the fleet; each batch spreads over all")
    parser.add_argument("--keep", type=Path, default=None, help="keep the stack's data and logs in this directory")
    args = parser.parse_args()
    args.owners = max(1, args.owners)
    units = {"SHESHNAG_SCHEDULER_UNIT_MIN_LINES": str(args.unit_lines),
             "SHESHNAG_SCHEDULER_UNIT_MAX_LINES": str(args.unit_lines), "SHESHNAG_EXECUTOR_CHUNK_LINES": "2"}
    if args.executor_ttl_s is not None:
        units["SHESHNAG_NATS_EXECUTOR_TTL_S"] = str(args.executor_ttl_s)
    with tempfile.TemporaryDirectory() as tmp:
        base = args.keep or Path(tmp)
        base.mkdir(parents=True, exist_ok=True)
        stack = start_stack(base / "data", free_port(), units)
        extras = ExtraExecutors(stack, args.executors)
        try:
            clients = owners(stack, args.owners)
            time.sleep(15 if args.executors > 1 else 0)  # the extra executors load the model and register
            calm = run(stack, extras, clients, "calm", args, kills=0, pauses=0)
            chaos = run(stack, extras, clients, "chaos", args, kills=args.kills, pauses=args.pauses)
        finally:
            extras.stop()
            stop_stack(stack)
    later = args.pauses * BATCHES_AFTER_PAUSE
    print(f"\n{args.batches} batches (+{later} sent after pauses) of {args.owners} owner(s), interleaved, x "
          f"{args.lines} lines (max_tokens 64) in units of {args.unit_lines}, {args.executors} executor(s)\n")
    print("| run | seconds | lines lost | lines duplicated | batches not completed | faults |")
    print("|---|---|---|---|---|---|")
    for name, (seconds, lost, duplicated, incomplete, killed) in (("undisturbed", calm), ("chaos", chaos)):
        print(f"| {name} | {seconds:.1f} | {lost} | {duplicated} | {incomplete} | {', '.join(killed) or '-'} |")
    print(f"\nslowdown under chaos: {chaos[0] / calm[0]:.2f}x")


if __name__ == "__main__":
    main()
