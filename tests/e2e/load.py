"""Dashboard-like load on a running stack, and what it leaves behind: shared by the soak e2e test and bench/soak.py.

Every answer is checked as it comes: any 5xx is counted, and every list must hold every item this client created
before it asked (a list is complete and consistent with the caller's own earlier writes)."""

import asyncio
import json
import random
from collections import Counter
from dataclasses import dataclass, field

import aiohttp
import nats
import psutil

from contracts.lifecycle import TERMINAL
from contracts.subjects import EVENTS_STREAM, EXECUTORS_BUCKET, READ_MODEL_BUCKET, WORK_STREAM
from infra.nats_auth import NatsAuth
from tests.e2e.conftest import ADMIN_KEY, RunningStack
from tests.factories import chat_line, jsonl, lost_and_duplicated

STREAMS = (EVENTS_STREAM, WORK_STREAM, f"KV_{READ_MODEL_BUCKET}", f"KV_{EXECUTORS_BUCKET}")
SERVICES = ("gateway", "validator", "scheduler", "ledger", "executor", "nats", "s3")
STORAGE_SERVERS = frozenset({"nats", "s3"})
"""The broker and the object store: their data files (a file per volume or block, opened as data grows) are storage,
not a leak, so only their other descriptors (sockets, pipes) are counted."""


def chat_lines(tag: str, count: int, max_tokens: int = 4) -> bytes:
    return jsonl(chat_line(f"{tag}-{i}", f"Say {i}.", max_tokens=max_tokens) for i in range(count)).getvalue()


@dataclass
class Load:
    """One client of the stack (one key), with what it created and every problem it saw."""

    stack: RunningStack
    session: aiohttp.ClientSession
    key: str = ADMIN_KEY
    statuses: Counter[int] = field(default_factory=Counter)
    short_lists: int = 0
    files: set[str] = field(default_factory=set)
    batches: dict[str, list[str]] = field(default_factory=dict)
    """Batch id → the custom_ids of its lines."""
    problems: list[str] = field(default_factory=list)
    last_refusal: str = ""
    """The last 4xx or 5xx answer, with its body."""

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.stack.port}{path}"

    async def call(self, method: str, path: str, **kwargs: object) -> tuple[int, object]:
        async with self.session.request(method, self.url(path), headers=self.headers, **kwargs) as response:  # type: ignore[arg-type]
            body = await response.read()
            self.statuses[response.status] += 1
            if response.status >= 400:
                self.last_refusal = f"{method} {path}: {response.status} {body[:300]!r}"
            if response.status >= 500:
                self.problems.append(f"{method} {path}: {response.status} {body[:200]!r}")
            try:
                return response.status, json.loads(body) if body else None
            except ValueError:
                return response.status, None

    async def upload(self, content: bytes, name: str = "in.jsonl") -> str | None:
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("file", content, filename=name, content_type="application/octet-stream")
        status, body = await self.call("POST", "/v1/files", data=form)
        if status != 200 or not isinstance(body, dict):
            return None
        self.files.add(body["id"])
        return str(body["id"])

    async def create_batch(self, tag: str, lines: int, max_tokens: int = 4) -> str | None:
        file_id = await self.upload(chat_lines(tag, lines, max_tokens), f"{tag}.jsonl")
        if file_id is None:
            return None
        status, body = await self.call("POST", "/v1/batches", json={
            "input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"})
        if status != 200 or not isinstance(body, dict):
            return None
        self.batches[body["id"]] = [f"{tag}-{i}" for i in range(lines)]
        return str(body["id"])

    async def list_all(self, what: str) -> set[str]:
        """Every id of `what` (batches or files), walking the cursor; a short answer is counted."""
        expected = set(self.batches if what == "batches" else self.files)
        seen: set[str] = set()
        after = ""
        while True:
            status, page = await self.call("GET", f"/v1/{what}?limit=100{after}")
            if status != 200 or not isinstance(page, dict):
                return seen
            seen |= {item["id"] for item in page["data"]}
            if not page.get("has_more") or not page["data"]:
                break
            after = f"&after={page['data'][-1]['id']}"
        if not expected <= seen:
            self.short_lists += 1
            self.problems.append(f"list of {what} lacks {len(expected - seen)} of {len(expected)} own items")
        return seen

    async def poll(self, rounds: int, rng: random.Random) -> None:
        """What an open dashboard tab does: lists, a retrieve, the overview and the fleet, again and again."""
        for _ in range(rounds):
            await self.list_all("batches")
            await self.list_all("files")
            if self.batches:
                await self.call("GET", f"/v1/batches/{rng.choice(list(self.batches))}")
            await self.call("GET", "/v1/organization/overview")
            await self.call("GET", "/v1/provider/executors")

    async def drop_sse(self, batch_id: str) -> None:
        """Open the batch's event stream, read its first bytes, and go away abruptly."""
        async with self.session.get(self.url(f"/v1/batches/{batch_id}/events"), headers=self.headers) as response:
            self.statuses[response.status] += 1
            if response.status == 200:
                await response.content.read(16)
            transport = response.connection.transport if response.connection else None
            if transport is not None:
                transport.abort()

    async def until_ended(self, batch_id: str, timeout_s: float = 300) -> str:
        """Poll the batch until it is terminal; its status (or the last one seen at the timeout)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        status = "unknown"
        while asyncio.get_running_loop().time() < deadline:
            code, batch = await self.call("GET", f"/v1/batches/{batch_id}")
            if code == 200 and isinstance(batch, dict):
                status = batch["status"]
                if status in TERMINAL:
                    break
            await asyncio.sleep(0.5)
        return status

    async def every_line_once(self) -> tuple[int, int, int]:
        """(lines lost, lines duplicated, batches not terminal) over every batch this client created."""
        lost = duplicated = open_ = 0
        for batch_id, ids in self.batches.items():
            status, batch = await self.call("GET", f"/v1/batches/{batch_id}")
            if status != 200 or not isinstance(batch, dict) or batch["status"] not in TERMINAL:
                open_ += 1
                continue
            seen: Counter[str] = Counter()
            for file_id in (batch.get("output_file_id"), batch.get("error_file_id")):
                if file_id:
                    async with self.session.get(self.url(f"/v1/files/{file_id}/content"),
                                                headers=self.headers) as response:
                        for line in (await response.read()).splitlines():
                            seen[json.loads(line)["custom_id"]] += 1
            missing, extra = lost_and_duplicated(ids, seen)
            lost, duplicated = lost + missing, duplicated + extra
        return lost, duplicated, open_


@dataclass(frozen=True)
class Sample:
    """What the stack holds at one moment: per process fds, threads and RSS; per stream consumers; connections."""

    processes: dict[str, tuple[int, int, float]]
    consumers: dict[str, int]
    nats_connections: int


async def sample(stack: RunningStack) -> Sample:
    processes: dict[str, tuple[int, int, float]] = {}
    for name in SERVICES:
        try:
            process = psutil.Process(stack.service_pid(name))
            fds = process.num_fds() - (len(process.open_files()) if name in STORAGE_SERVERS else 0)
            processes[name] = (fds, process.num_threads(), process.memory_info().rss / 2**20)
        except (OSError, psutil.Error, ValueError):
            processes[name] = (-1, -1, -1.0)
    connections = sum(1 for c in psutil.net_connections("tcp")
                      if c.laddr and c.laddr.port == stack.nats_port and c.status == psutil.CONN_ESTABLISHED)
    nc = await nats.connect(core_nats_url(stack))
    try:
        js = nc.jetstream()
        consumers = {stream: (await js.stream_info(stream)).state.consumer_count for stream in STREAMS}
    finally:
        await nc.close()
    return Sample(processes, consumers, connections)


def core_nats_url(stack: RunningStack) -> str:
    """The broker as the stack's own services reach it (the `core` user of the generated secrets)."""
    return NatsAuth.load_or_create(stack.data_dir).core_url(stack.nats_port)
