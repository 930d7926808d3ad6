"""The control plane's own cost (issue 31): a stack as `sheshnag up` starts it, its executor on the `simulated`
engine (each line answered at once, nothing computed), so what is measured is what our services, the broker and the
object store spend around each line and each batch.

Per workload it prints the lines/s and batches/s coordinated, the CPU seconds (from /proc: steady on a noisy machine
where wall time is not) of each process per line and per batch, the facts and bytes appended to the event stream per
line and per batch; then the p50 of a 1-line batch's create → completed on the idle stack.

Workloads: one large batch (`--lines`, the issue's 20,000), and `--batches` batches of 3 lines from `--owners`
owners (the issue's 2,000 from 50).

Usage: .venv/bin/python bench/control_plane.py [--lines 20000] [--batches 2000] [--owners 50] [--singles 20]
"""

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp
import nats

from bench.cpu import cpu_seconds
from contracts.lifecycle import TERMINAL
from contracts.subjects import EVENTS_STREAM
from infra.embedded import free_port
from tests.e2e.conftest import ADMIN_KEY, RunningStack, start_stack, stop_stack
from tests.e2e.load import core_nats_url

SERVICES = ("gateway", "validator", "scheduler", "ledger", "executor")
SERVERS = ("nats", "s3")
"""Their pid files are named by their logs: nats.pid, s3.pid."""
MODEL = "sim"
CATALOGUE = f"""
[[models]]
id = "{MODEL}"
engine = "simulated"
artifact = "{{artifact}}"
context_length = 4096
slots = 64
memory_bytes = 1000
endpoints = ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings"]
"""



def pids(stack: RunningStack) -> dict[str, int]:
    return {name: stack.service_pid(name) for name in (*SERVICES, *SERVERS)}


def lines(tag: str, count: int) -> bytes:
    return b"".join(json.dumps({"custom_id": f"{tag}-{i}", "method": "POST", "url": "/v1/chat/completions",
                                "body": {"model": MODEL, "max_tokens": 8,
                                         "messages": [{"role": "user", "content": f"Say {i}."}]}}).encode() + b"\n"
                    for i in range(count))


@dataclass
class Client:
    http: aiohttp.ClientSession
    base: str
    key: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    async def batch(self, tag: str, count: int) -> str:
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("file", lines(tag, count), filename=f"{tag}.jsonl")
        async with self.http.post(f"{self.base}/v1/files", data=form, headers=self.headers) as answer:
            assert answer.status == 200, await answer.text()
            file_id = (await answer.json())["id"]
        async with self.http.post(f"{self.base}/v1/batches", headers=self.headers, json={
                "input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}) as answer:
            assert answer.status == 200, await answer.text()
            return str((await answer.json())["id"])

    async def ended(self, batch_id: str, poll_s: float = 0.5) -> dict[str, object]:
        while True:
            async with self.http.get(f"{self.base}/v1/batches/{batch_id}", headers=self.headers) as answer:
                batch: dict[str, object] = await answer.json()
            if batch["status"] in TERMINAL:
                return batch
            await asyncio.sleep(poll_s)


async def new_owner(http: aiohttp.ClientSession, base: str, n: int) -> Client:
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    user_id = f"bench-owner-{n}"
    async with http.post(f"{base}/v1/organization/users", json={"id": user_id}, headers=admin) as answer:
        assert answer.status == 200, await answer.text()
    async with http.post(f"{base}/v1/organization/keys", json={"user_id": user_id}, headers=admin) as answer:
        assert answer.status == 200, await answer.text()
        return Client(http, base, str((await answer.json())["value"]))


async def stream_state(stack: RunningStack) -> tuple[int, int, Counter[str]]:
    """The event stream's facts and bytes, and its facts by kind and name (`batch.progressed`, …)."""
    connection = await nats.connect(core_nats_url(stack))
    try:
        info = await connection.jetstream().stream_info(EVENTS_STREAM, subjects_filter=">")
        by_name: Counter[str] = Counter()
        for subject, count in (info.state.subjects or {}).items():
            parts = subject.split(".")
            by_name[f"{parts[1]}.{parts[-1]}"] += count
        return info.state.messages, info.state.bytes, by_name
    finally:
        await connection.close()


@dataclass
class Measured:
    name: str
    batches: int
    lines: int
    wall_s: float
    cpu: dict[str, float]
    facts: int
    fact_bytes: int
    by_name: Counter[str]


async def measure(stack: RunningStack, name: str, batches: int, total_lines: int,
                  work: Callable[[], Awaitable[None]]) -> Measured:
    processes = pids(stack)
    facts0, bytes0, names0 = await stream_state(stack)
    cpu0 = {process: cpu_seconds(pid) for process, pid in processes.items()}
    started = time.monotonic()
    await work()
    wall = time.monotonic() - started
    cpu = {process: cpu_seconds(pid) - cpu0[process] for process, pid in processes.items()}
    facts1, bytes1, names1 = await stream_state(stack)
    return Measured(name, batches, total_lines, wall, cpu, facts1 - facts0, bytes1 - bytes0, names1 - names0)


async def one_large_batch(owner: Client, count: int) -> None:
    batch = await owner.ended(await owner.batch("large", count), poll_s=1.0)
    assert batch["status"] == "completed", batch


async def many_small_batches(owners: list[Client], count: int) -> None:
    async def of_owner(owner: Client, n: int) -> None:
        ids = [await owner.batch(f"o{n}-b{b}", 3) for b in range(count // len(owners))]
        for batch_id in ids:
            batch = await owner.ended(batch_id, poll_s=1.0)
            assert batch["status"] == "completed", batch
    await asyncio.gather(*(of_owner(owner, n) for n, owner in enumerate(owners)))


def table(rows: list[Measured]) -> str:
    names = [*SERVICES, *SERVERS]
    out = ["| workload | lines/s | batches/s | " + " | ".join(names) + " | all | facts | fact bytes |",
           "|---|---|---|" + "---|" * len(names) + "---|---|---|"]
    for row in rows:
        per, unit = (row.lines, "ms/line") if row.batches == 1 else (row.batches, "ms/batch")
        cells = [f"{row.cpu[name] / per * 1000:.3f}" for name in names]
        out.append(f"| {row.name} ({unit}) | {row.lines / row.wall_s:.0f} | {row.batches / row.wall_s:.2f} | "
                   + " | ".join(cells) + f" | {sum(row.cpu.values()) / per * 1000:.3f} | "
                   f"{row.facts / per:.2f} | {row.fact_bytes / per:.0f} |")
    return "\n".join(out)


def write_catalogue(folder: Path) -> Path:
    """A catalogue of one model on the simulated engine (its artifact an existing file nothing reads)."""
    artifact = folder / "simulated.weights"
    artifact.write_bytes(b"simulated")
    catalogue = folder / "catalogue.toml"
    catalogue.write_text(CATALOGUE.replace("{artifact}", str(artifact)))
    return catalogue


async def run(args: argparse.Namespace, data_dir: Path, catalogue: Path) -> None:
    port = free_port()
    stack = start_stack(data_dir, port, {
        "SHESHNAG_CATALOGUE_PATH": str(catalogue), "SHESHNAG_EXECUTOR_ENGINE": "simulated",
        "SHESHNAG_GATEWAY_CONTROL_CALLS_PER_S": "100000", "SHESHNAG_GATEWAY_CONTROL_CALL_BURST": "100000",
        "SHESHNAG_GATEWAY_MAX_ACTIVE_BATCHES": "100000", **dict(setting.split("=", 1) for setting in args.env)})
    base = f"http://127.0.0.1:{port}"
    rows = []
    singles: list[float] = []
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as http:
            owners = [await new_owner(http, base, n) for n in range(args.owners)]
            await one_large_batch(owners[0], 10)  # warm: the executor loads its model, every consumer exists
            for _ in range(args.singles):
                started = time.monotonic()
                batch = await owners[0].ended(await owners[0].batch("single", 1), poll_s=0.02)
                assert batch["status"] == "completed", batch
                singles.append((time.monotonic() - started) * 1000)
            rows.append(await measure(stack, f"1 batch x {args.lines} lines", 1, args.lines,
                                      lambda: one_large_batch(owners[0], args.lines)))
            per_owner = args.batches // args.owners
            rows.append(await measure(stack, f"{per_owner * args.owners} batches x 3 lines, {args.owners} owners",
                                      per_owner * args.owners, per_owner * args.owners * 3,
                                      lambda: many_small_batches(owners, args.batches)))
    finally:
        stop_stack(stack)
    print("\nCPU of each process, ms per line (the large batch) or per batch (the small ones); facts and bytes "
          "appended to the EVENTS stream per line or per batch\n")
    print(table(rows))
    for row in rows:
        per = row.lines if row.batches == 1 else row.batches
        print(f"\nfacts per {'line' if row.batches == 1 else 'batch'}, {row.name}: " + ", ".join(
            f"{name} {count / per:.3f}" for name, count in row.by_name.most_common()))
    print(f"\n1-line batch, create -> completed on an idle stack: p50 {statistics.median(singles):.0f} ms, "
          f"p90 {statistics.quantiles(singles, n=10)[8]:.0f} ms ({len(singles)} batches; polled every 20 ms)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=20_000)
    parser.add_argument("--batches", type=int, default=2_000)
    parser.add_argument("--owners", type=int, default=50)
    parser.add_argument("--singles", type=int, default=20)
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting for the stack (e.g. SHESHNAG_EXECUTOR_CHUNK_LINES=256), to compare")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(run(args, Path(tmp) / "data", write_catalogue(Path(tmp))))


if __name__ == "__main__":
    main()
