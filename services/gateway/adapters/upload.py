"""Streaming an upload into the object store part by part (no whole-file buffering), SHA-256 and size on the way; a
stalled client or store ends it with a clean error, and nothing of a refused upload is kept."""

import asyncio
import hashlib
from collections.abc import Awaitable
from dataclasses import dataclass

from aiohttp import BodyPartReader
from minio.error import S3Error

from contracts.billing import FileDemand
from services.gateway.adapters.demand import DemandCounter
from services.gateway.http.body_pace import BodyPace
from services.gateway.usecases.refusals import ApiError, bad_request
from services.runtime.storage.objectstore import TRANSIENT, ObjectStore

CHUNK = 256 * 1024
SNIFF_BYTES = 4096


@dataclass(frozen=True)
class StoredUpload:
    bytes: int
    sha256: str
    line_count: int
    demand: FileDemand


class Tally:
    """What a file's bytes come to as they stream by: SHA-256, size, lines and worst case."""

    def __init__(self) -> None:
        self.digest, self.demand = hashlib.sha256(), DemandCounter()
        self.size = self.newlines = 0
        self.last = b""

    def feed(self, chunk: bytes) -> None:
        self.digest.update(chunk)
        self.demand.feed(chunk)
        self.size += len(chunk)
        self.newlines += chunk.count(b"\n")
        self.last = chunk[-1:]

    def stored(self) -> StoredUpload:
        lines = self.newlines + (1 if self.last not in (b"", b"\n") else 0)
        return StoredUpload(bytes=self.size, sha256=self.digest.hexdigest(), line_count=lines,
                            demand=self.demand.finish())


def store_unavailable(error: BaseException) -> ApiError:
    return ApiError(503, f"The object store is unavailable ({type(error).__name__}); nothing was stored. Try again "
                    "shortly.", "server_error", "object_store_unavailable", retry_after_s=5)


async def stream_part_to_store(part: BodyPartReader, store: ObjectStore, key: str, max_bytes: int,
                               pace: BodyPace, store_s: float) -> StoredUpload:
    """Copy the file part into the store under `key`, the client paced, the store given `store_s` for each part."""
    writer = store.writer(key, "application/jsonl", own_key=True)  # a new file id's
    tally = Tally()
    head = b""
    try:
        while chunk := await pace.read(part.read_chunk(CHUNK)):
            tally.feed(chunk)
            if tally.size > max_bytes:
                raise ApiError(413, f"The file is larger than the {max_bytes} byte limit.",
                               code="file_too_large", param="file")
            if len(head) < SNIFF_BYTES:  # fail fast on a file plainly not JSONL, before the validator sees it
                head += chunk[: SNIFF_BYTES - len(head)]
                if (stripped := head.lstrip(b"\xef\xbb\xbf \t\r\n")) and not stripped.startswith(b"{"):
                    raise bad_request("The file is not JSONL: each line must be one JSON object starting with '{'.",
                                      "invalid_file_format", "file")
            await _to_store(writer.write(chunk), store_s)
        await _to_store(writer.finish(), store_s)
    except BaseException:
        await asyncio.shield(writer.abort())  # a refused, broken or abandoned upload leaves no object behind
        raise
    return tally.stored()


async def _to_store(step: Awaitable[None], store_s: float) -> None:
    try:
        async with asyncio.timeout(store_s):
            await step
    except (TimeoutError, S3Error, *TRANSIENT) as error:
        raise store_unavailable(error) from None

