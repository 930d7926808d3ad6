"""A shared fleet (issue 15): is scheduling fair and line-level, and what does it cost? One table, every figure a
ratio or value measured in this run.

Rows:
1. a 1-line batch of user B behind user A's big batch: B's create→completed ÷ the same on the idle stack (≤ 3)
2. 3 users, one batch each, together: each one's share of the lines done when the first batch ends (33 % ± 5)
3. 32 batches x 3 lines (max_tokens 32, ignore_eos): the raw engine's wall time on the same 96 requests ÷ the
   stack's (≥ 0.95)
4. 16 distinct ~1,000-token system prompts interleaved over 512 lines (max_tokens 16): raw engine in file order
   ÷ the stack, wall time (≥ 1.3)
5. one 1,000-line batch on 1 executor ÷ on 2 (each pinned to its own cores with taskset where it can be)
6. the scheduler alone, 1,000 executors and 10,000 queued batches in memory: one `decide()` and one
   `FairQueue.take`, p99 (< 10 ms)
7. a 1-line batch's create→completed on the idle stack, p50 of 10 (< 300 ms), with where the time goes

"Raw engine": the executor's own llama.cpp adapter (services/executor/adapters/engines/llamacpp.py: the same
xllamacpp parameters, slots, threads and prompt cache as the stack's executor), in this process, fed the lines in
file order with no stack around it. Rows 1-4 and 7 share one stack (`sheshnag up`, tests/e2e/conftest.py); row 5
starts its own, with an extra executor as tests/e2e/test_fleet.py does. Nothing here asserts a time.

Usage: .venv/bin/python bench/fleet.py [--only 1,6,7] [--quick] [--big-lines 2000] [--share-lines 600]
           [--small-batches 32] [--prefix-lines 512] [--fleet-lines 1000] [--runs 10] [--decide-runs 5]
           [--keep DIR]
`--quick` shrinks every size (big 150, share 120, prefix 32, fleet 200, decide runs 2) so a run takes minutes;
an explicit size flag still wins over it.
"""

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openai import OpenAI
from openai.types import Batch

from bench.throughput import warm_up
from contracts.api.batch import Endpoint
from contracts.catalogue import Catalogue, CatalogueModel
from contracts.events.batch import BatchAssigned, BatchValidated, BatchWaiting
from contracts.events.executor import DeviceMemory, ExecutorAdvert
from contracts.events.registry import decode_event
from contracts.lifecycle import TERMINAL
from contracts.subjects import batch_events
from infra.embedded import free_port
from services.executor.adapters.engines.llamacpp import LlamaCppEngine
from services.executor.settings import ExecutorSettings
from services.runtime.nats import eventlog
from services.runtime.nats.broker import TOOL_ATTEMPTS
from services.runtime.nats.bus import EventBus
from services.runtime.storage.catalogue import load_catalogue
from services.scheduler.book import Book
from services.scheduler.decisions import Action, Assign, Wait, decide
from services.scheduler.fair_share import FairQueue, QueuedBatch
from tests.e2e.conftest import ADMIN_KEY, RunningStack, start_stack, stop_stack
from tests.e2e.load import core_nats_url
from tests.e2e.test_fleet import api, executors, start_executor, wait_for
from tests.factories import Line, batch_created, chat_line, upload, upload_when_key_known, wait_until_done

MODEL = "smollm2-135m-instruct-q4_1"
CHAT: Endpoint = "/v1/chat/completions"
POLL_S = 0.02
"""How often a timed batch is polled: reads are not rate-limited, and 20 ms is far below what is measured."""
SETTLED_POLL_S = 0.5
"""How often row 3 polls: it takes its end from the log, so its polling only has to notice the end."""
STACK_ENV = {"SHESHNAG_GATEWAY_CONTROL_CALLS_PER_S": "1000", "SHESHNAG_GATEWAY_CONTROL_CALL_BURST": "10000",
             "SHESHNAG_GATEWAY_MAX_ACTIVE_BATCHES": "10000"}
QUICK = {"big_lines": 150, "share_lines": 120, "prefix_lines": 32, "fleet_lines": 200, "decide_runs": 2}
DEFAULTS = {"big_lines": 2000, "share_lines": 600, "small_batches": 32, "prefix_lines": 512, "fleet_lines": 1000,
            "runs": 10, "decide_runs": 5}
WORDS = ("river", "lantern", "copper", "meadow", "harbor", "signal", "orchard", "granite", "velvet", "compass",
         "thunder", "library", "saddle", "glacier", "pepper", "window", "marble", "falcon", "canyon", "ember",
         "quartz", "willow", "anchor", "basket", "cobalt", "dune", "engine", "fable", "garnet", "hollow")


@dataclass
class Row:
    figure: str
    value: str
    goal: str
    note: str = ""


@dataclass
class Bench:
    """The run's sizes, its shared stack (started on first use) and the raw engine's figures measured so far."""

    args: argparse.Namespace
    scratch: Path
    stack: RunningStack | None = None
    users: dict[str, str] = field(default_factory=dict)
    """User id → an API key of theirs."""

    def shared_stack(self) -> RunningStack:
        if self.stack is None:
            (self.scratch / "shared").mkdir(parents=True, exist_ok=True)
            self.stack = start_stack(self.scratch / "shared" / "data", free_port(), STACK_ENV)
            client = self.stack.client(ADMIN_KEY)
            upload_when_key_known(client, [line("warm-key", 1)])
            warm_up(client, body(1))  # services finish starting (tokenizer, model, registration) untimed
        return self.stack

    def key_of(self, user: str) -> str:
        """An API key of a user of its own on the shared stack (created through the admin API, as tests do)."""
        if user not in self.users:
            stack = self.shared_stack()
            api(stack, "POST", "/v1/organization/users", json={"id": user})
            self.users[user] = str(api(stack, "POST", "/v1/organization/keys",
                                       json={"user_id": user, "name": f"{user} bench"})["value"])
            upload_when_key_known(stack.client(self.users[user]), [line("key-known", 1)])
        return self.users[user]

    def close(self) -> None:
        if self.stack is not None:
            stop_stack(self.stack)
            self.stack = None


# Lines and the engine.


def body(max_tokens: int, prompt: str = "Say hello.", seed: int = 7, system: str | None = None) -> dict[str, object]:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    return {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "seed": seed, "temperature": 0.7,
            "ignore_eos": True}


def line(custom_id: str, max_tokens: int, **fields: object) -> Line:
    return chat_line(custom_id, "Say hello.", MODEL, max_tokens, ignore_eos=True, temperature=0.7, **fields)


def as_lines(tag: str, bodies: list[dict[str, object]]) -> list[Line]:
    return [{"custom_id": f"{tag}-{i}", "method": "POST", "url": CHAT, "body": b} for i, b in enumerate(bodies)]


def chat_model() -> CatalogueModel:
    model = load_catalogue(None).resolve(MODEL)
    assert model is not None
    return model


@contextmanager
def output_to(log_file: Path) -> Iterator[None]:
    """This process's stdout and stderr (llama.cpp writes its log to them) into `log_file` meanwhile."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with log_file.open("ab") as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def raw_engine(bodies: list[dict[str, object]], log_file: Path) -> tuple[float, int, int]:
    """(wall s, completion tokens, prompt tokens) of the bodies on the executor's llama.cpp adapter, alone."""
    with output_to(log_file):
        return _raw_engine(bodies)


def _raw_engine(bodies: list[dict[str, object]]) -> tuple[float, int, int]:
    engine = LlamaCppEngine(ExecutorSettings().n_threads)
    engine.load(chat_model())

    async def run() -> tuple[float, int, int]:
        await engine.run(CHAT, {**bodies[0], "max_tokens": 1})  # untimed, as the stack's warm-up batch
        started = time.perf_counter()
        # Tasks start in creation order: the adapter's pool of `slots` workers takes the lines in file order.
        replies = await asyncio.gather(*(engine.run(CHAT, b) for b in bodies))
        elapsed = time.perf_counter() - started
        bad = [reply for reply in replies if not reply.ok]
        if bad:
            raise RuntimeError(f"{len(bad)} raw engine replies failed: {bad[0]}")
        usage: list[dict[str, int]] = [reply.body["usage"] for reply in replies]  # type: ignore[misc]
        return elapsed, sum(u["completion_tokens"] for u in usage), sum(u["prompt_tokens"] for u in usage)

    try:
        return asyncio.run(run())
    finally:
        engine.unload()


# Batches through the stack.


def create(client: OpenAI, file_id: str) -> Batch:
    return client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")


def timed_batch(client: OpenAI, file_id: str, timeout_s: float = 1800) -> tuple[float, Batch]:
    """(create→completed seconds as the client sees it, the batch)."""
    started = time.perf_counter()
    batch, _ = wait_until_done(client, create(client, file_id).id, timeout_s, POLL_S)
    elapsed = time.perf_counter() - started
    if batch.status != "completed":
        raise RuntimeError(f"batch {batch.id} ended {batch.status}: {batch.errors}")
    return elapsed, batch


def end_all(client: OpenAI, batch_ids: list[str]) -> None:
    """Cancel what has not ended and wait for every one to end, so the next row starts on an idle stack."""
    for batch_id in batch_ids:
        if client.batches.retrieve(batch_id).status not in TERMINAL:
            client.batches.cancel(batch_id)
    for batch_id in batch_ids:
        wait_until_done(client, batch_id, 300, 0.25)


def completed_lines(batch: Batch) -> int:
    return batch.request_counts.completed if batch.request_counts else 0


async def fact_times(stack: RunningStack, batch_id: str) -> dict[str, int]:
    """Each fact type of the batch → when it first occurred (ms since the epoch, the stating service's clock)."""
    bus = await EventBus.connect(core_nats_url(stack), "bench-fleet", attempts=TOOL_ATTEMPTS, declare=False)
    seen: dict[str, int] = {}
    try:
        async for fact in eventlog.read(bus, batch_events(batch_id)):
            event = decode_event(fact.data)
            seen.setdefault(event.type.removeprefix("batch."), event.occurred_at)
    finally:
        await bus.close()
    return seen


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


# Rows.


def row_fifo(bench: Bench) -> Row:
    """1: B's 1-line batch behind A's big batch, against B's 1-line batch on the idle stack."""
    big = bench.args.big_lines
    a, b = bench.shared_stack().client(bench.key_of("bench-a")), bench.shared_stack().client(bench.key_of("bench-b"))
    idle = statistics.median(timed_batch(b, upload(b, [line(f"idle-{i}", 16)]))[0] for i in range(3))
    big_file = upload(a, [line(f"a-{i}", 16, seed=i) for i in range(big)], "a.jsonl")
    small_file = upload(b, [line("b-0", 16)], "b.jsonl")
    a_batch = create(a, big_file)
    wait_for(lambda: completed_lines(a.batches.retrieve(a_batch.id)) > 0, 600, "A's batch never started")
    try:
        behind, _ = timed_batch(b, small_file)
        a_done = completed_lines(a.batches.retrieve(a_batch.id))
    finally:
        end_all(a, [a_batch.id])
    return Row(f"1-line batch (user B) behind user A's {big}-line batch ÷ same on idle stack",
               f"{behind / idle:.1f} ({ms(behind)} ÷ {ms(idle)})", "≤ 3",
               f"A had {a_done}/{big} lines done when B completed; idle = median of 3; max_tokens 16; A cancelled "
               "after")


def row_shares(bench: Bench) -> Row:
    """2: three users' batches submitted together: who got the lines by the time the first one ended."""
    lines = bench.args.share_lines
    users = ("bench-c1", "bench-c2", "bench-c3")
    clients = {user: bench.shared_stack().client(bench.key_of(user)) for user in users}
    files = {user: upload(client, [line(f"{user}-{i}", 16, seed=i) for i in range(lines)])
             for user, client in clients.items()}
    batches = {user: create(client, files[user]).id for user, client in clients.items()}
    try:
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline:
            seen = {user: clients[user].batches.retrieve(batch_id) for user, batch_id in batches.items()}
            if any(batch.status in TERMINAL for batch in seen.values()):
                break
            time.sleep(0.25)
        else:
            raise TimeoutError("no batch of the three ended")
    finally:
        for user, batch_id in batches.items():
            end_all(clients[user], [batch_id])
    done = {user: completed_lines(batch) for user, batch in seen.items()}
    total = max(sum(done.values()), 1)
    shares = [100 * done[user] / total for user in users]
    first = next(user for user in users if seen[user].status in TERMINAL)
    return Row(f"3 users x one {lines}-line batch, together: share of lines done when the first ends",
               " / ".join(f"{share:.0f} %" for share in shares), "33 % ± 5 each",
               f"lines done {', '.join(str(done[u]) for u in users)} (request_counts.completed); {first[-2:]} ended "
               f"first ({seen[first].status}); worst share off by {max(abs(s - 100 / 3) for s in shares):.0f} pts")


def row_small_batches(bench: Bench) -> Row:
    """3: many small batches through the stack against the raw engine on the same requests."""
    count = bench.args.small_batches
    bodies = [body(32, f"Write a line about {WORDS[i % len(WORDS)]}.", seed=i) for i in range(count * 3)]
    raw_s, raw_tokens, _ = raw_engine(bodies, bench.scratch / "raw-engine.log")
    stack = bench.shared_stack()
    client = stack.client(ADMIN_KEY)
    files = [upload(client, as_lines(f"s{b}", bodies[3 * b:3 * b + 3])) for b in range(count)]
    started = time.time()
    ids = [create(client, file_id).id for file_id in files]
    ended = [wait_until_done(client, batch_id, 1800, SETTLED_POLL_S)[0] for batch_id in ids]
    statuses = {batch.status for batch in ended}
    if statuses != {"completed"}:
        raise RuntimeError(f"small batches ended {statuses}")
    # The end is the last `batch.completed` fact's time, not when a poll saw it: polling every 20 ms would take the
    # 2 cores the engine needs (about 5 CPU-seconds of the client's and the gateway's over this row).
    stack_s = max(asyncio.run(fact_times(stack, batch_id))["completed"] for batch_id in ids) / 1000 - started
    stack_tokens = sum(json.loads(text)["response"]["body"]["usage"]["completion_tokens"] for batch in ended
                       for text in client.files.content(batch.output_file_id or "").text.splitlines())
    return Row(f"{count} batches x 3 lines (max_tokens 32, ignore_eos): raw engine wall ÷ stack wall",
               f"{raw_s / stack_s:.2f} ({raw_s:.1f} s ÷ {stack_s:.1f} s)", "≥ 0.95",
               f"{count * 3} requests, {chat_model().slots} slots both; completion tokens raw {raw_tokens}, stack "
               f"{stack_tokens} (ignore_eos passes through: the adapter forwards the body, contracts/engines.py "
               "lists it)")


def system_prompt(k: int, words: int = 840) -> str:
    rng = random.Random(k)
    return f"You are assistant number {k}. " + " ".join(rng.choice(WORDS) for _ in range(words))


def row_prefixes(bench: Bench) -> Row:
    """4: lines that share 16 long system prompts, interleaved: does the stack group them for the prompt cache?"""
    count = bench.args.prefix_lines
    prompts = [system_prompt(k) for k in range(16)]
    bodies = [body(16, f"Question {i}: name a colour.", seed=i, system=prompts[i % 16]) for i in range(count)]
    raw_s, _, prompt_tokens = raw_engine(bodies, bench.scratch / "raw-engine.log")
    client = bench.shared_stack().client(ADMIN_KEY)
    stack_s, batch = timed_batch(client, upload(client, as_lines("p", bodies), "prefix.jsonl"))
    usages = [json.loads(text)["response"]["body"]["usage"]
              for text in client.files.content(batch.output_file_id or "").text.splitlines()]
    cached = sum(usage.get("prompt_tokens_details", {}).get("cached_tokens", 0) for usage in usages)
    return Row(f"16 system prompts interleaved over {count} lines (max_tokens 16): raw engine in file order ÷ stack",
               f"{raw_s / stack_s:.2f} ({raw_s:.1f} s ÷ {stack_s:.1f} s)", "≥ 1.3",
               f"~{prompt_tokens / count:.0f} prompt tokens a line; one batch; wall time each; the stack's output "
               f"reports {cached / max(sum(usage['prompt_tokens'] for usage in usages), 1):.0%} of its prompt tokens "
               "cached (usage.prompt_tokens_details.cached_tokens, engine-reported)")


def pin(pid: int, cpus: str) -> bool:
    """Every thread of the process onto `cpus`; False where taskset cannot."""
    if shutil.which("taskset") is None:
        return False
    done = subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(pid)], capture_output=True)
    return done.returncode == 0


def row_scale_out(bench: Bench) -> Row:
    """5: one batch on one executor, then (a fresh copy) on two."""
    lines = bench.args.fleet_lines
    cpus = len(os.sched_getaffinity(0))
    halves = [f"0-{cpus // 2 - 1}", f"{cpus // 2}-{cpus - 1}"] if cpus >= 2 else []
    threads = str(max(cpus // 2, 1)) if halves else str(ExecutorSettings().n_threads)
    # test_fleet's extra executor commits chunks of 2 lines: the stack's own executor does the same here.
    env = {**STACK_ENV, "SHESHNAG_EXECUTOR_CHUNK_LINES": "2", "SHESHNAG_EXECUTOR_N_THREADS": threads,
           "SHESHNAG_SCHEDULER_UNIT_MIN_LINES": "32", "SHESHNAG_SCHEDULER_UNIT_MAX_LINES": "64"}
    saved = os.environ.get("SHESHNAG_EXECUTOR_N_THREADS")
    os.environ["SHESHNAG_EXECUTOR_N_THREADS"] = threads  # start_executor's process inherits it
    (bench.scratch / "fleet").mkdir(parents=True, exist_ok=True)
    stack = start_stack(bench.scratch / "fleet" / "data", free_port(), env)
    second: subprocess.Popen[bytes] | None = None
    try:
        client = stack.client(ADMIN_KEY)
        upload_when_key_known(client, [line("warm-key", 1)])
        warm_up(client, body(1))
        pinned = bool(halves) and pin(stack.service_pid("executor"), halves[0])
        one_s, _ = timed_batch(client, upload(client, [line(f"one-{i}", 16, seed=i) for i in range(lines)]))
        second = start_executor(stack, "bench-2", budget_mb=4096, preload=[MODEL])
        wait_for(lambda: executors(stack).get("bench-2", {}).get("health") == "live", 180, "bench-2 not live")
        pinned = pinned and pin(second.pid, halves[1])
        before = {name: row["lines_served"] for name, row in executors(stack).items()}
        two_s, _ = timed_batch(client, upload(client, [line(f"two-{i}", 16, seed=i) for i in range(lines)]))
        served = {name: row["lines_served"] - before.get(name, 0) for name, row in executors(stack).items()}
    finally:
        if second is not None and second.poll() is None:
            second.send_signal(signal.SIGTERM)
            second.wait(60)
        stop_stack(stack)
        if saved is None:
            os.environ.pop("SHESHNAG_EXECUTOR_N_THREADS")
        else:
            os.environ["SHESHNAG_EXECUTOR_N_THREADS"] = saved
    where = (f"pinned with taskset to CPUs {halves[0]} and {halves[1]}" if pinned
             else f"NOT pinned (taskset unavailable or refused; {cpus} CPUs shared)")
    return Row(f"one {lines}-line batch: 1 executor wall ÷ 2 executors wall",
               f"{one_s / two_s:.2f} ({one_s:.1f} s ÷ {two_s:.1f} s)", "report",
               f"{where}; {threads} engine thread(s) each; lines served on 2: "
               f"{', '.join(f'{k} {v}' for k, v in sorted(served.items()) if v)}; chunks of 2 lines, "
               "units of 32-64 lines, max_tokens 16")


def synthetic_fleet(executors_n: int = 1000, batches_n: int = 10_000, owners: int = 100,
                    parallel: int = 8) -> tuple[Book, list[ExecutorAdvert], Catalogue, int]:
    """A book of validated, unassigned batches of many owners and a fleet of live, admitted, idle executors, each
    running up to `parallel` units at once."""
    catalogue = load_catalogue(None)
    model = chat_model()
    now = int(time.time() * 1000)
    book = Book()
    adverts = []
    for e in range(executors_n):
        executor_id = f"sim-{e}"
        book.admitted.add(executor_id)
        book.known_executors[executor_id] = now
        adverts.append(ExecutorAdvert(
            executor_id=executor_id, engine="llamacpp", engine_version="sim", models=[model.id],
            loaded_models=[model.id], slots=model.slots, heartbeat_at=now, parallel_attempts=parallel,
            devices=[DeviceMemory(name="cpu", total_bytes=8 << 30, free_bytes=8 << 30)]))
    for b in range(batches_n):
        batch_id, owner = f"batch_sim{b}", f"key-{b % owners}"
        book.apply(batch_created(batch_id, owner, "files/x", created_at=now // 1000,
                                 expires_at=now // 1000 + 86_400, endpoint=CHAT))
        book.apply(BatchValidated(aggregate_id=batch_id, total_lines=100 + b % 900, model=model.id))
    return book, adverts, catalogue, now


def p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def apply_decisions(book: Book, actions: list[Action], now: int) -> None:
    """Fold what the term would publish for these actions, as it does."""
    for action in actions:
        if isinstance(action, Assign):
            book.apply(BatchAssigned(aggregate_id=action.plan.batch_id, executor_id=action.executor_id,
                                     attempt=action.attempt, lease_token="t", shard=action.shard,
                                     shards=action.layout.shards, shard_span=action.layout.span, occurred_at=now))
        elif isinstance(action, Wait):
            book.apply(BatchWaiting(aggregate_id=action.plan.batch_id, reason=action.reason))


def row_scheduler(bench: Bench) -> list[Row]:
    """6: the scheduler's decisions alone, at fleet scale: a tick that fills every place of an idle fleet (one
    decision per unit handed out), a tick of the same fleet full (the standing cost of a tick), the fair queue."""
    filling: list[float] = []
    handed: list[int] = []
    steady: list[float] = []
    for _ in range(bench.args.decide_runs):
        book, adverts, catalogue, now = synthetic_fleet()
        started = time.perf_counter()
        actions = decide(book, adverts, catalogue, now)
        filling.append(time.perf_counter() - started)
        handed.append(sum(isinstance(action, Assign) for action in actions))
        apply_decisions(book, actions, now)
        for _ in range(20):
            started = time.perf_counter()
            apply_decisions(book, decide(book, adverts, catalogue, now), now)
            steady.append(time.perf_counter() - started)
    per_decision = [tick / max(count, 1) for tick, count in zip(filling, handed, strict=True)]
    book, adverts, catalogue, now = synthetic_fleet()
    queued = [QueuedBatch(plan.batch_id, plan.owner, None, plan.model or MODEL, plan.validated_order,
                          plan.expires_at_ms, plan.total_lines, plan.total_lines, unit_lines=64)
              for plan in book.plans.values()]
    takes: list[float] = []
    for _ in range(5):
        queue = FairQueue([QueuedBatch(**vars(batch)) for batch in queued], now_ms=now)
        for advert in adverts * 8:
            started = time.perf_counter()
            queue.take(advert.models, 64)
            takes.append(time.perf_counter() - started)
    return [
        Row("scheduler: one decision (a unit handed out), 1,000 executors x 8 places, 10,000 queued batches, p99",
            f"{p99(per_decision) * 1e6:.0f} µs", "< 10 ms",
            f"a tick filling the idle fleet: {statistics.median(handed):.0f} units in {ms(statistics.median(filling))}"
            f" (p99 {ms(p99(filling))}); {len(filling)} runs; main before: one decide() of the same population "
            "(1 place each) 58 s p99"),
        Row("scheduler: a tick of the same fleet with every place taken, p99", ms(p99(steady)), "report",
            f"median {ms(statistics.median(steady))} over {len(steady)} ticks: one pass over the 10,000 open "
            "batches (expiry, cancel, fences, finalize), nothing to hand out"),
        Row("fair queue FairQueue.take: one take on the same population, p99", f"{p99(takes) * 1e6:.0f} µs",
            "< 10 ms", f"{len(takes)} takes (8,000 per tick, 64-line units, 5 ticks); heaps of owners, O(log owners)"),
    ]


PHASES = ("validated", "assigned", "started", "progressed", "shard_finished", "finalizing", "completed")


def row_latency(bench: Bench) -> Row:
    """7: the fixed cost of one batch: a 1-line batch on the idle stack, and the facts' times on the way."""
    stack = bench.shared_stack()
    client = stack.client(ADMIN_KEY)
    times: list[float] = []
    steps: dict[str, list[int]] = {}
    for i in range(bench.args.runs):
        file_id = upload(client, [line(f"one-{i}", 1)])  # the 1-line, 1-token batch
        created_ms = time.time() * 1000
        elapsed, batch = timed_batch(client, file_id)
        times.append(elapsed)
        facts = asyncio.run(fact_times(stack, batch.id))
        previous = facts.get("created", int(created_ms))
        steps.setdefault("created (after the call began)", []).append(previous - int(created_ms))
        for phase in PHASES:
            if phase in facts:
                steps.setdefault(f"→{phase}", []).append(facts[phase] - previous)
                previous = facts[phase]
        steps.setdefault("→seen by the client", []).append(int(created_ms + elapsed * 1000) - previous)
    breakdown = ", ".join(f"{name} {statistics.median(gaps):.0f}" for name, gaps in steps.items())
    return Row("1-line batch create→completed on the idle stack, p50",
               f"{ms(statistics.median(times))}", "< 300 ms",
               f"{len(times)} runs, min {ms(min(times))}, max {ms(max(times))}; median ms between facts: {breakdown}")


ROWS: dict[int, Callable[[Bench], Row | list[Row]]] = {
    6: row_scheduler, 7: row_latency, 1: row_fifo, 2: row_shares, 3: row_small_batches, 4: row_prefixes,
    5: row_scale_out}
"""In the order they run: the pure ones, the idle stack's, the loaded ones, and the one with its own stack."""


def table(results: dict[int, list[Row]]) -> str:
    out = ["| # | figure | measured | goal | note |", "|---|---|---|---|---|"]
    for number in sorted(results):
        for index, row in enumerate(results[number]):
            label = f"{number}{'abc'[index]}" if len(results[number]) > 1 else str(number)
            out.append(f"| {label} | {row.figure} | {row.value} | {row.goal} | {row.note} |")
    return "\n".join(out)


@contextmanager
def scratch_dir(keep: Path | None) -> Iterator[Path]:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory() as tmp:
        yield Path(tmp)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="rows to run, e.g. 1,6,7 (default: all)")
    parser.add_argument("--quick", action="store_true", help=f"small sizes: {QUICK}")
    for name in DEFAULTS:
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=None,
                            help=f"default {DEFAULTS[name]}, quick {QUICK.get(name, DEFAULTS[name])}")
    parser.add_argument("--keep", type=Path, help="keep the stacks' data dirs (logs) here")
    args = parser.parse_args()
    for name, default in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, QUICK.get(name, default) if args.quick else default)
    return args


def main() -> None:
    args = parse()
    wanted = {int(n) for n in args.only.split(",") if n.strip()} or set(ROWS)
    results: dict[int, list[Row]] = {}
    failed = False
    with scratch_dir(args.keep) as scratch:
        bench = Bench(args, scratch)
        try:
            for number, measure in ROWS.items():
                if number not in wanted:
                    continue
                started = time.perf_counter()
                try:
                    measured = measure(bench)
                except Exception as error:  # one row's failure is reported in its row; the others still run
                    failed = True
                    what = (measure.__doc__ or measure.__name__).split(": ", 1)[-1]
                    why = f"{type(error).__name__}: {error}".replace("|", "/")[:300]
                    measured = Row(what, "FAILED", "", why)
                results[number] = measured if isinstance(measured, list) else [measured]
                print(f"row {number} took {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
        finally:
            bench.close()
    sizes = ", ".join(f"{name} {getattr(args, name)}" for name in DEFAULTS)
    print(f"\nShared fleet (issue 15), {len(os.sched_getaffinity(0))} CPUs; sizes: {sizes}\n")
    print(table(results))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
