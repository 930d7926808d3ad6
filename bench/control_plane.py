"""The control plane's own cost (issue 31): a stack as `sheshnag up` starts it, its executor on the `simulated`
engine (each line answered at once, nothing computed), so what is measured is what our services, the broker and the
object store spend around each line and each batch.

Per workload it prints the lines/s and batches/s coordinated, the CPU seconds (from /proc: steady on a noisy machine
where wall time is not) of each process per line and per batch, the facts and bytes appended to the event stream per
line and per batch, the S3 requests (the object store's own count, by method), the broker messages each process sent
and received (the broker's `/connz`) and every message by subject kind; then the p50 of a 1-line batch's create →
completed on the idle stack.

Workloads: one large batch (`--lines`, the issue's 20,000), and `--batches` batches of 3 lines from `--owners`
owners (the issue's 2,000 from 50).

Usage: .venv/bin/python bench/control_plane.py [--lines 20000] [--batches 2000] [--owners 50] [--singles 20]
       [--history N] [--profile DIR]
0 skips a workload. --history: creates by an owner with N ended batches against a new owner's, CPU per create.
--profile: py-spy samples each service during each workload (DIR/<workload>-<service>.collapsed; read them with
bench/profile_top.py; needs py-spy installed and ptrace allowed).
"""

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp
import nats.aio.msg

from bench.cpu import cpu_seconds, reference_cpu_ms
from contracts.lifecycle import TERMINAL
from contracts.subjects import EVENTS_STREAM
from infra.embedded import ServerMetrics, bindable, free_port
from infra.service_names import SERVICES as STARTED_SERVICES
from infra.supervisor import server_metrics
from services.runtime.nats import eventlog
from services.runtime.nats.broker import TOOL_ATTEMPTS
from services.runtime.nats.bus import EventBus
from services.runtime.process.settings import ConnectionSettings
from tests.e2e.conftest import ADMIN_KEY, RunningStack, start_stack, stop_stack
from tests.e2e.load import core_nats_url

SERVICES = ("gateway", "validator", "scheduler", "ledger", "executor")
SERVERS = ("nats", "s3")
LINGER_S = 12.0
"""Settling before the idle measurement: longer than an executor's batch feed lingers (watch.py LINGER_S)."""
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
        return (await self.batch_and_file(tag, count))[0]

    async def batch_and_file(self, tag: str, count: int) -> tuple[str, str, float]:
        """The batch's id, its input file's id, and when (epoch seconds) its create call was made."""
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("file", lines(tag, count), filename=f"{tag}.jsonl")
        async with self.http.post(f"{self.base}/v1/files", data=form, headers=self.headers) as answer:
            assert answer.status == 200, await answer.text()
            file_id = (await answer.json())["id"]
        created = time.time()
        async with self.http.post(f"{self.base}/v1/batches", headers=self.headers, json={
                "input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}) as answer:
            assert answer.status == 200, await answer.text()
            return str((await answer.json())["id"]), file_id, created

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
    for _ in range(100):  # a fresh stack's gateway may answer before the ledger folded the admin key
        async with http.post(f"{base}/v1/organization/users", json={"id": user_id}, headers=admin) as answer:
            if answer.status != 401:
                assert answer.status == 200, await answer.text()
                break
        await asyncio.sleep(0.1)
    async with http.post(f"{base}/v1/organization/keys", json={"user_id": user_id}, headers=admin) as answer:
        assert answer.status == 200, await answer.text()
        return Client(http, base, str((await answer.json())["value"]))


async def probe(stack: RunningStack) -> EventBus:
    """This benchmark's own connection to the stack's broker, as an operator tool's (it declares nothing)."""
    return await EventBus.connect(core_nats_url(stack), "bench-control-plane", attempts=TOOL_ATTEMPTS, declare=False)


async def stream_state(stack: RunningStack) -> tuple[int, int, Counter[str]]:
    """The event stream's facts and bytes, and its facts by kind and name (`batch.progressed`, …)."""
    bus = await probe(stack)
    try:
        info = await bus.js.stream_info(EVENTS_STREAM, subjects_filter=">")
        by_name: Counter[str] = Counter()
        for subject, count in (info.state.subjects or {}).items():
            parts = subject.split(".")
            by_name[f"{parts[1]}.{parts[-1]}"] += count
        return info.state.messages, info.state.bytes, by_name
    finally:
        await bus.close()


async def fact_times(stack: RunningStack, batch_id: str, input_file_id: str) -> list[tuple[str, float]]:
    """The facts of one batch and of its input file, in log order, each with its time in the stream (seconds)."""
    bus = await probe(stack)
    try:
        facts: list[tuple[int, str, float]] = []
        for subject in (f"evt.file.{input_file_id}.>", f"evt.batch.{batch_id}.>"):
            async for fact in eventlog.read(bus, subject):
                stored = eventlog.published_at(fact)
                assert stored is not None  # a read's facts say when the stream stored them
                facts.append((fact.sequence, fact.subject.split(".")[-1], stored.timestamp()))
        return [(name, at) for _, name, at in sorted(facts)]
    finally:
        await bus.close()


def time_breakdown(lives: list[list[tuple[str, float]]], created: list[float]) -> str:
    """The median time from the create call (or the step before) to each fact of a 1-line batch's life."""
    steps: dict[str, list[float]] = {}
    for life, started in zip(lives, created, strict=True):
        previous = started
        for name, at in life:
            if at < started:
                continue  # the input file's upload, before the create call
            steps.setdefault(name, []).append((at - previous) * 1000)
            previous = at
    return ", ".join(f"{name} +{statistics.median(gaps):.0f}" for name, gaps in steps.items())


def subject_kind(subject: str) -> str:
    """A subject with its ids blanked (`evt.batch.batch_12.started` → `evt.batch.*.started`), inboxes as one."""
    if subject.startswith("_INBOX."):
        return "_INBOX (replies)"
    return ".".join("*" if any(c.isdigit() for c in token) or len(token) > 24 else token
                    for token in subject.split("."))


class BrokerTally:
    """Every message the broker carries in the services' account during a workload, counted by subject kind (a
    core subscription to `>` sees publishes, requests, replies, JetStream API calls and KV operations)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.bus: EventBus | None = None

    async def start(self, stack: RunningStack) -> None:
        self.bus = await probe(stack)

        async def count(message: nats.aio.msg.Msg) -> None:
            self.counts[subject_kind(message.subject)] += 1
        await self.bus.nc.subscribe(">", cb=count)

    async def stop(self) -> Counter[str]:
        if self.bus is not None:
            await self.bus.close()
        return self.counts


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
    messages: Counter[str]
    s3_requests: Counter[str]
    connections: dict[str, tuple[int, int]]
    """Messages each process sent and received through the broker (its connections', by the broker's count)."""


def start_profiles(stack: RunningStack, folder: Path | None, workload: str) -> list[subprocess.Popen[bytes]]:
    """One py-spy sampler per service (raw collapsed stacks of the thread holding the GIL: where its Python CPU
    goes, not where it waits), stopped by `stop_profiles`."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if folder is None:
        return []
    folder.mkdir(parents=True, exist_ok=True)
    tag = "".join(c if c.isalnum() else "-" for c in workload)
    return [subprocess.Popen([spy, "record", "--pid", str(stack.service_pid(name)), "--format", "raw", "--rate",
                              "200", "--nonblocking", "--gil", "-o", str(folder / f"{tag}-{name}.collapsed")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for name in SERVICES]


def stop_profiles(samplers: list[subprocess.Popen[bytes]]) -> None:
    for sampler in samplers:
        sampler.send_signal(2)
    for sampler in samplers:
        sampler.wait(timeout=60)


METRICS_PORTS = len(STARTED_SERVICES) + 2
"""The stack's metrics ports from the base (`infra.supervisor.server_metrics`): the services', S3's, the broker's."""


def metrics_base() -> int:
    """A base port with every metrics port of the stack free from it."""
    while True:
        base = free_port()
        if all(bindable(port) for port in range(base, base + METRICS_PORTS)):
            return base


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return str(answer.read().decode())


def s3_requests(metrics: ServerMetrics) -> Counter[str]:
    """SeaweedFS's S3 requests so far, by method (`SeaweedFS_s3_request_total{type=…}`)."""
    counts: Counter[str] = Counter()
    for line in scrape(f"http://127.0.0.1:{metrics.s3_port}/metrics").splitlines():
        if line.startswith("SeaweedFS_s3_request_total{"):
            labels, _, value = line.rpartition(" ")
            kind = labels.split('type="', 1)[1].split('"', 1)[0]
            counts[kind] += int(float(value))
    return counts


def connection_messages(metrics: ServerMetrics) -> dict[str, tuple[int, int]]:
    """Messages each named client has sent and received so far (the broker's `/connz`), summed over a process's
    connections: `executor-local-0`, `scheduler`, …"""
    totals: dict[str, tuple[int, int]] = {}
    for connection in json.loads(scrape(f"http://127.0.0.1:{metrics.broker_port}/connz?limit=4096"))["connections"]:
        name = connection.get("name") or "unnamed"
        sent, received = totals.get(name, (0, 0))
        totals[name] = (sent + connection["in_msgs"], received + connection["out_msgs"])
    return totals


async def measure(stack: RunningStack, metrics: ServerMetrics, name: str, batches: int, total_lines: int,
                  work: Callable[[], Awaitable[None]], profile: Path | None = None) -> Measured:
    processes = pids(stack)
    s3_before, connections_before = s3_requests(metrics), connection_messages(metrics)
    facts0, bytes0, names0 = await stream_state(stack)
    cpu0 = {process: cpu_seconds(pid) for process, pid in processes.items()}
    tally = BrokerTally()
    await tally.start(stack)
    samplers = start_profiles(stack, profile, name)
    started = time.monotonic()
    try:
        await work()
    finally:
        stop_profiles(samplers)
    wall = time.monotonic() - started
    messages = await tally.stop()
    cpu = {process: cpu_seconds(pid) - cpu0[process] for process, pid in processes.items()}
    facts1, bytes1, names1 = await stream_state(stack)
    connections = {process: (sent - connections_before.get(process, (0, 0))[0],
                             received - connections_before.get(process, (0, 0))[1])
                   for process, (sent, received) in connection_messages(metrics).items()}
    return Measured(name, batches, total_lines, wall, cpu, facts1 - facts0, bytes1 - bytes0, names1 - names0,
                    messages, s3_requests(metrics) - s3_before, connections)


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


HISTORY_CREATES = 30
"""Creates measured per owner in the history workload."""


async def creates_after_history(stack: RunningStack, metrics: ServerMetrics, http: aiohttp.ClientSession, base: str,
                                history: int) -> list[str]:
    """An owner with `history` ended batches and a new owner each create HISTORY_CREATES more, one after another:
    the gateway's (and ledger's) CPU per create of each, which should not grow with the owner's history."""
    veteran, newcomer = await new_owner(http, base, 9000), await new_owner(http, base, 9001)
    for start in range(0, history, 50):
        ids = await asyncio.gather(*(veteran.batch(f"h{n}", 1) for n in range(start, min(start + 50, history))))
        await asyncio.gather(*(veteran.ended(batch_id, poll_s=0.5) for batch_id in ids))
    rows = []
    for label, owner in ((f"{history} ended batches", veteran), ("new owner", newcomer)):
        async def creates(owner: Client = owner, label: str = label) -> None:
            ids = [await owner.batch(f"{label[:3]}{n}", 1) for n in range(HISTORY_CREATES)]
            await asyncio.gather(*(owner.ended(batch_id, poll_s=0.5) for batch_id in ids))
        row = await measure(stack, metrics, label, HISTORY_CREATES, HISTORY_CREATES, creates)
        rows.append(f"| {label} | {HISTORY_CREATES} | {row.cpu['gateway'] / HISTORY_CREATES * 1000:.2f} | "
                    f"{row.cpu['ledger'] / HISTORY_CREATES * 1000:.2f} | "
                    f"{sum(row.cpu.values()) / HISTORY_CREATES * 1000:.2f} |")
    return rows


def all_ms(row: Measured) -> float:
    """CPU ms of every process together, per line (the large batch) or per batch (the small ones)."""
    return sum(row.cpu.values()) / (row.lines if row.batches == 1 else row.batches) * 1000


def table(rows: list[Measured]) -> str:
    names = [*SERVICES, *SERVERS]
    out = ["| workload | lines/s | batches/s | " + " | ".join(names) + " | all | facts | fact bytes |",
           "|---|---|---|" + "---|" * len(names) + "---|---|---|"]
    for row in rows:
        per, unit = (row.lines, "ms/line") if row.batches == 1 else (row.batches, "ms/batch")
        cells = [f"{row.cpu[name] / per * 1000:.3f}" for name in names]
        out.append(f"| {row.name} ({unit}) | {row.lines / row.wall_s:.0f} | {row.batches / row.wall_s:.2f} | "
                   + " | ".join(cells) + f" | {all_ms(row):.3f} | "
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
    port, metrics_port = free_port(), metrics_base()
    metrics = server_metrics(ConnectionSettings(metrics_port=metrics_port, metrics_address="127.0.0.1"))
    stack = start_stack(data_dir, port, {"SHESHNAG_METRICS_PORT": str(metrics_port),
        "SHESHNAG_CATALOGUE_PATH": str(catalogue), "SHESHNAG_EXECUTOR_ENGINE": "simulated",
        "SHESHNAG_GATEWAY_CONTROL_CALLS_PER_S": "100000", "SHESHNAG_GATEWAY_CONTROL_CALL_BURST": "100000",
        "SHESHNAG_GATEWAY_MAX_ACTIVE_BATCHES": "100000", **dict(setting.split("=", 1) for setting in args.env)})
    base = f"http://127.0.0.1:{port}"
    reference = [reference_cpu_ms()]
    rows = []
    history_rows: list[str] = []
    singles: list[float] = []
    lives: list[list[tuple[str, float]]] = []
    creates: list[float] = []
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as http:
            owners = [await new_owner(http, base, n) for n in range(args.owners)]
            await one_large_batch(owners[0], 10)  # warm: the executor loads its model, every consumer exists
            for _ in range(args.singles):
                started = time.monotonic()
                batch_id, file_id, created = await owners[0].batch_and_file("single", 1)
                batch = await owners[0].ended(batch_id, poll_s=0.02)
                assert batch["status"] == "completed", batch
                singles.append((time.monotonic() - started) * 1000)
                lives.append(await fact_times(stack, batch_id, file_id))
                creates.append(created)
            if args.lines:
                rows.append(await measure(stack, metrics, f"1 batch x {args.lines} lines", 1, args.lines,
                                          lambda: one_large_batch(owners[0], args.lines), args.profile))
            per_owner = args.batches // args.owners
            if per_owner:
                small = f"{per_owner * args.owners} batches x 3 lines, {args.owners} owners"
                rows.append(await measure(stack, metrics, small, per_owner * args.owners, per_owner * args.owners * 3,
                                          lambda: many_small_batches(owners, args.batches), args.profile))
            if args.history:
                history_rows = await creates_after_history(stack, metrics, http, base, args.history)
            if args.idle:
                await asyncio.sleep(LINGER_S)  # what the workloads left (feeds lingering, retries) winds down
                idle = await measure(stack, metrics, f"idle stack, {args.idle:.0f} s", 0, 0,
                                     lambda: asyncio.sleep(args.idle), args.profile)
    finally:
        stop_stack(stack)
    reference.append(reference_cpu_ms())
    print("\nCPU of each process, ms per line (the large batch) or per batch (the small ones); facts and bytes "
          "appended to the EVENTS stream per line or per batch\n")
    print(table(rows))
    speed = statistics.mean(reference)
    print(f"\nHost speed: a fixed pure-Python workload took {reference[0]:.0f} / {reference[1]:.0f} CPU-ms (before / "
          "after the workloads); the same code costs up to three times as much CPU on a crowded host, so compare runs "
          "made at different times by `all` in units of it: " + ", ".join(
              f"{row.name} {all_ms(row) / speed:.4f}" for row in rows))
    for row in rows:
        per = row.lines if row.batches == 1 else row.batches
        print(f"\nfacts per {'line' if row.batches == 1 else 'batch'}, {row.name}: " + ", ".join(
            f"{name} {count / per:.3f}" for name, count in row.by_name.most_common()))
        unit = "line" if row.batches == 1 else "batch"
        print(f"S3 requests per {unit} ({sum(row.s3_requests.values()) / per:.2f} in all), {row.name}: " + ", ".join(
            f"{kind} {count / per:.2f}" for kind, count in row.s3_requests.most_common()))
        print(f"broker messages per {unit} sent / received by each process, {row.name}: " + ", ".join(
            f"{process} {sent / per:.1f} / {received / per:.1f}" for process, (sent, received) in sorted(
                row.connections.items(), key=lambda item: -sum(item[1])) if sent or received))
        print(f"broker messages per {'line' if row.batches == 1 else 'batch'} ({sum(row.messages.values()) / per:.2f}"
              f" in all), {row.name}: " + ", ".join(f"{name} {count / per:.2f}"
                                                    for name, count in row.messages.most_common()
                                                    if count / per >= 0.1))
    if len(singles) >= 2:
        print(f"\n1-line batch, create -> completed on an idle stack: p50 {statistics.median(singles):.0f} ms, "
              f"p90 {statistics.quantiles(singles, n=10)[8]:.0f} ms ({len(singles)} batches; polled every 20 ms)")
        print(f"where it goes (ms from the create call, then from the fact before, medians): "
              f"{time_breakdown(lives, creates)}")
    if args.idle:
        print(f"\nIdle stack ({args.idle:.0f} s after the workloads, {LINGER_S:.0f} s settled): CPU ms per second of "
              "each process; broker messages per second\n")
        names = [*SERVICES, *SERVERS]
        print("| " + " | ".join(names) + " | all | messages/s |\n|" + "---|" * (len(names) + 2))
        print("| " + " | ".join(f"{idle.cpu[name] / idle.wall_s * 1000:.1f}" for name in names)
              + f" | {sum(idle.cpu.values()) / idle.wall_s * 1000:.1f} | "
              f"{sum(idle.messages.values()) / idle.wall_s:.1f} |")
        print("messages per second by kind: " + ", ".join(f"{name} {count / idle.wall_s:.2f}"
                                                        for name, count in idle.messages.most_common(12)))
    if args.history:
        print(f"\nGateway CPU per create (upload + create of a 1-line batch), ms: an owner with {args.history} ended "
              "batches against a new owner, the same run\n")
        print("| owner | creates | gateway ms/create | ledger ms/create | all ms/create |\n|---|---|---|---|---|")
        print("\n".join(history_rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=20_000)
    parser.add_argument("--batches", type=int, default=2_000)
    parser.add_argument("--owners", type=int, default=50)
    parser.add_argument("--singles", type=int, default=20)
    parser.add_argument("--idle", type=float, default=0.0, metavar="S",
                        help="also: CPU of each process per second over S seconds of an idle stack")
    parser.add_argument("--history", type=int, default=0, metavar="N",
                        help="also: creates by an owner with N ended batches against a new owner's (CPU per create)")
    parser.add_argument("--profile", type=Path, default=None, metavar="DIR",
                        help="sample each service with py-spy during each workload, into DIR")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting for the stack (e.g. SHESHNAG_EXECUTOR_CHUNK_LINES=256), to compare")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(run(args, Path(tmp) / "data", write_catalogue(Path(tmp))))


if __name__ == "__main__":
    main()
