"""JetStream's own stream snapshots, driven over core NATS: `$JS.API.STREAM.SNAPSHOT` writes a stream (its
messages with their sequences, headers and gaps, and its consumers' state) to a file; `$JS.API.STREAM.RESTORE`
makes the stream again from that file on an empty broker. The file is the server's own format (an S2-compressed
tar), the same one `nats stream backup` writes: it is stored as received and sent back as stored.
"""

import asyncio
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg

from contracts.subjects import JS_API

API = JS_API
CHUNK_BYTES = 128 * 1024
"""Well under the broker's 1 MiB payload limit."""
SNAPSHOT_IDLE_S = 30.0
"""A snapshot whose next chunk takes longer than this has stalled."""
RESTORE_FINISH_S = 120.0
"""The server rebuilds the stream from the staged file after the last chunk before it answers."""


class SnapshotFailed(RuntimeError):
    """The broker refused or broke off a snapshot or a restore; the message says which stream and why."""


@dataclass(frozen=True)
class Snapshot:
    stream: str
    path: Path
    bytes: int
    sha256: str
    config: dict[str, Any]
    """The stream's configuration as the server reported it (restored with it, replicas adjusted)."""
    state: dict[str, Any]
    """Messages, bytes, first and last sequence at the instant the snapshot was taken."""


def _answer(reply: Msg, stream: str, doing: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(reply.data or b"{}")
    if body.get("error"):
        raise SnapshotFailed(f"{doing} {stream}: {body['error'].get('description', body['error'])}")
    return body


async def stream_names(nc: Client) -> list[str]:
    """Every stream of the account the connection is in (KV buckets are streams `KV_<bucket>`)."""
    names: list[str] = []
    while True:
        reply = await nc.request(f"{API}.STREAM.NAMES", json.dumps({"offset": len(names)}).encode(), timeout=10)
        body = _answer(reply, "*", "listing")
        page = body.get("streams") or []
        names += page
        if not page or len(names) >= body.get("total", 0):
            return sorted(names)


async def snapshot(nc: Client, stream: str, path: Path) -> Snapshot:
    """Write `stream`'s snapshot, consumers included, to `path` while the stream keeps taking messages: the
    server snapshots one consistent instant."""
    inbox = nc.new_inbox()
    chunks: asyncio.Queue[Msg] = asyncio.Queue()

    async def received(msg: Msg) -> None:
        await chunks.put(msg)

    subscription = await nc.subscribe(inbox, cb=received)
    digest, size = hashlib.sha256(), 0
    try:
        request = {"deliver_subject": inbox, "no_consumers": False, "chunk_size": CHUNK_BYTES}
        answer = _answer(await nc.request(f"{API}.STREAM.SNAPSHOT.{stream}", json.dumps(request).encode(),
                                          timeout=30), stream, "snapshot of")
        with path.open("wb") as out:
            while True:
                try:
                    chunk = await asyncio.wait_for(chunks.get(), SNAPSHOT_IDLE_S)
                except TimeoutError:
                    raise SnapshotFailed(f"snapshot of {stream}: no chunk for {SNAPSHOT_IDLE_S:.0f}s") from None
                if not chunk.data:  # the end: an empty message (a status header at most)
                    break
                out.write(chunk.data)
                digest.update(chunk.data)
                size += len(chunk.data)
                if chunk.reply:  # the server's flow control: each chunk is acknowledged
                    await nc.publish(chunk.reply, b"")
    finally:
        await subscription.unsubscribe()
    return Snapshot(stream, path, size, digest.hexdigest(), answer.get("config") or {}, answer.get("state") or {})


async def exists(nc: Client, stream: str) -> bool:
    reply = await nc.request(f"{API}.STREAM.INFO.{stream}", b"", timeout=10)
    body = json.loads(reply.data or b"{}")
    if body.get("error", {}).get("code") == 404:
        return False
    _answer(reply, stream, "looking up")
    return True


async def restore(nc: Client, stream: str, path: Path, config: dict[str, Any], state: dict[str, Any],
                  replicas: int) -> dict[str, Any]:
    """Make `stream` from its snapshot file; the broker refuses a stream that exists already. Returns the
    restored stream's state as the server reports it."""
    config = {**config, "num_replicas": replicas}
    request = {"config": config, "state": state}
    answer = _answer(await nc.request(f"{API}.STREAM.RESTORE.{stream}", json.dumps(request).encode(), timeout=30),
                     stream, "restore of")
    deliver = answer["deliver_subject"]
    with path.open("rb") as source:
        while chunk := source.read(CHUNK_BYTES):
            reply = await nc.request(deliver, chunk, timeout=30)
            if reply.data:
                raise SnapshotFailed(f"restore of {stream}: {reply.data.decode(errors='replace')}")
    done = _answer(await nc.request(deliver, b"", timeout=RESTORE_FINISH_S), stream, "restore of")
    restored: dict[str, Any] = done.get("state") or {}
    return restored
