"""Streaming an upload into the object store: no whole-file buffering, SHA-256 and size on the way."""

import asyncio
import hashlib
import queue
from dataclasses import dataclass

from aiohttp import BodyPartReader

from services.gateway.errors import ApiError, bad_request
from services.runtime.objectstore import ObjectStore

CHUNK = 256 * 1024
PIPE_DEPTH = 8
SNIFF_BYTES = 4096


class _Pipe:
    """A blocking file-like reader fed by the event loop, so minio's thread can pull chunks."""

    def __init__(self) -> None:
        self.chunks: queue.Queue[bytes] = queue.Queue(maxsize=PIPE_DEPTH)
        self.buffer = b""
        self.ended = False

    def read(self, size: int = -1, /) -> bytes:
        while not self.ended and (size < 0 or len(self.buffer) < size):
            chunk = self.chunks.get()
            if not chunk:
                self.ended = True
                break
            self.buffer += chunk
        if size < 0:
            size = len(self.buffer)
        out, self.buffer = self.buffer[:size], self.buffer[size:]
        return out


@dataclass(frozen=True)
class StoredUpload:
    bytes: int
    sha256: str
    line_count: int


def check_jsonl_start(head: bytes) -> None:
    """Fail fast on files that are plainly not JSONL, before the validator ever sees them."""
    stripped = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if stripped and not stripped.startswith(b"{"):
        raise bad_request("The file is not JSONL: each line must be one JSON object starting with '{'.",
                          "invalid_file_format", "file")


async def stream_part_to_store(part: BodyPartReader, store: ObjectStore, key: str, max_bytes: int) -> StoredUpload:
    pipe = _Pipe()
    upload = asyncio.create_task(store.put_stream(key, pipe, "application/jsonl"))
    digest = hashlib.sha256()
    size = newlines = 0
    last = b""
    head = b""
    completed = False
    try:
        while chunk := await part.read_chunk(CHUNK):
            size += len(chunk)
            if size > max_bytes:
                raise ApiError(413, f"The file is larger than the {max_bytes} byte limit.",
                               code="file_too_large", param="file")
            if len(head) < SNIFF_BYTES:
                head += chunk[: SNIFF_BYTES - len(head)]
                check_jsonl_start(head)
            digest.update(chunk)
            newlines += chunk.count(b"\n")
            last = chunk[-1:]
            await asyncio.to_thread(pipe.chunks.put, chunk)
        completed = True
    finally:
        await asyncio.to_thread(pipe.chunks.put, b"")
        await upload
        if not completed:
            # A refused or broken upload leaves nothing behind in the object store.
            await store.remove(key)
    lines = newlines + (1 if last not in (b"", b"\n") else 0)
    return StoredUpload(bytes=size, sha256=digest.hexdigest(), line_count=lines)
