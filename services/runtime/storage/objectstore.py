"""The S3 object store (MinIO in production, SeaweedFS locally) through the blocking `minio` client: every call runs
in the store's own bounded pool with its data in hand, so no thread waits for another (an upload goes part by part
as its bytes arrive, never through a pipe a second thread must fill)."""

import asyncio
import contextlib
import functools
import io
import logging
import ssl
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import urllib3
from minio import Minio
from minio.datatypes import Part
from minio.error import S3Error

from services.runtime.process.settings import ConnectionSettings
from services.runtime.storage.lines import LineSplitter

log = logging.getLogger(__name__)

UPLOAD_PART_BYTES = 8 * 1024 * 1024
"""Bytes of an upload held before they are sent as one multipart part (S3's minimum part is 5 MiB)."""
READ_CHUNK = 256 * 1024
IO_THREADS = 16
"""Blocking S3 calls one process runs at once; more wait for a thread (each call is bounded by the timeouts)."""
Result = TypeVar("Result")


class ObjectNotFound(Exception):
    pass


MISSING_OBJECT_CODES = ("NoSuchKey", "NoSuchObject")
"""The S3 error codes of an object that is not there."""


TRANSIENT = (urllib3.exceptions.HTTPError, OSError)
"""What a dead, slow or restarting S3 server raises through minio (after urllib3's own retries)."""


def https_pool(ca: Path | None, **pool: object) -> urllib3.PoolManager:
    """A urllib3 pool whose HTTPS trusts the system's CAs and `ca` (a private CA's PEM) besides, verifying names."""
    context = ssl.create_default_context()
    if ca is not None:
        context.load_verify_locations(cafile=ca)
    return urllib3.PoolManager(ssl_context=context, **pool)  # type: ignore[arg-type]


class ObjectStore:
    def __init__(self, client: Minio, bucket: str, io_threads: int = IO_THREADS) -> None:
        self.client = client
        self.bucket = bucket
        self.pool = ThreadPoolExecutor(max_workers=io_threads, thread_name_prefix="s3")

    async def run(self, call: Callable[..., Result], *args: object) -> Result:
        """One blocking minio call in the store's pool."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, functools.partial(call, *args))

    def close(self) -> None:
        """Stop taking calls; a call in flight ends by its own timeout, and nobody waits for it."""
        self.pool.shutdown(wait=False, cancel_futures=True)

    @classmethod
    def from_settings(cls, settings: ConnectionSettings) -> "ObjectStore":
        http = https_pool(
            settings.s3_tls_ca, num_pools=4, maxsize=16, timeout=urllib3.Timeout(connect=5, read=60),
            retries=urllib3.Retry(total=3, backoff_factor=0.2, status_forcelist=(500, 502, 503, 504)),
        )
        client = Minio(settings.s3_endpoint, access_key=settings.s3_access_key, secret_key=settings.s3_secret_key,
                       secure=settings.s3_secure, http_client=http)
        return cls(client, settings.s3_bucket)

    async def ensure_bucket(self, within_s: float = 30.0) -> None:
        """The server may refuse calls for a moment after it starts: retry until it answers."""
        await self.run(self._ensure_bucket, within_s)

    def _ensure_bucket(self, within_s: float) -> None:
        deadline = time.monotonic() + within_s
        while True:
            try:
                if not self.client.bucket_exists(self.bucket):
                    self.client.make_bucket(self.bucket)
                return
            except (S3Error, *TRANSIENT) as error:
                if isinstance(error, S3Error) and error.code == "BucketAlreadyOwnedByYou":
                    return
                if time.monotonic() > deadline:
                    raise
                log.info("object store not ready yet: %s", error)
                time.sleep(0.3)

    def writer(self, key: str, content_type: str, *, own_key: bool = False) -> "StreamingUpload":
        """An object written as its bytes arrive, in bounded parts; `finish()` makes it visible, `abort()` drops what
        it sent. `own_key`: the key is this upload's alone (fresh and unique), so `abort()` also removes an object its
        `finish` may have made; a key written again (an archive's, a deterministic file's) keeps the object it held."""
        return StreamingUpload(self, key, content_type, own_key=own_key)

    async def put_bytes(self, key: str, data: bytes, content_type: str = "application/jsonl") -> None:
        await self.run(self.client.put_object, self.bucket, key, io.BytesIO(data), len(data), content_type)

    async def get_bytes(self, key: str) -> bytes:
        return await self.run(self._get_bytes, key)

    def _get_bytes(self, key: str) -> bytes:
        response = self._open(key)
        try:
            return response.read()
        finally:
            response.close()
            response.release_conn()

    def _open(self, key: str) -> urllib3.BaseHTTPResponse:
        with _missing_as_not_found(key):
            return self.client.get_object(self.bucket, key)

    async def iter_chunks(self, key: str) -> AsyncGenerator[bytes, None]:
        """Stream an object in bounded chunks without holding it whole in memory."""
        response = await opened(self.run(self._open, key))
        async with contextlib.aclosing(read_chunks(response, self.run)) as chunks:
            async for chunk in chunks:
                yield chunk

    def iter_lines(self, key: str) -> AsyncGenerator[bytes, None]:
        """Each line of an object, without its line ending (the last line may lack one)."""
        return split_lines(self.iter_chunks(key))

    async def size_of(self, key: str) -> int:
        """The object's size in bytes; ObjectNotFound when there is none."""
        return await self.run(self._size_of, key)

    def _size_of(self, key: str) -> int:
        with _missing_as_not_found(key):
            return int(self.client.stat_object(self.bucket, key).size or 0)

    async def list_keys(self, prefix: str) -> list[str]:
        return await self.run(self._list_keys, prefix)

    def _list_keys(self, prefix: str) -> list[str]:
        objects: Iterator = self.client.list_objects(self.bucket, prefix=prefix, recursive=True)
        return sorted(obj.object_name for obj in objects if obj.object_name)

    async def list_page(self, prefix: str, after: str, limit: int) -> list[tuple[str, float]]:
        """Up to `limit` objects under `prefix` after the key `after` ("": from the first), in key order: each key and
        when it was last written (seconds since the epoch). One call holds one page, however many objects there are."""
        return await self.run(self._list_page, prefix, after, limit)

    def _list_page(self, prefix: str, after: str, limit: int) -> list[tuple[str, float]]:
        page: list[tuple[str, float]] = []
        for obj in self.client.list_objects(self.bucket, prefix=prefix, recursive=True, start_after=after or None):
            if obj.object_name:
                # A store that states no time: written now, as far as anyone may tell (never taken for old).
                written = obj.last_modified.timestamp() if obj.last_modified else time.time()
                page.append((obj.object_name, written))
                if len(page) >= limit:
                    break
        return page

    async def remove(self, key: str) -> None:
        await self.run(self.client.remove_object, self.bucket, key)


@contextlib.contextmanager
def _missing_as_not_found(key: str) -> Iterator[None]:
    """S3's answer that `key` is not there, as ObjectNotFound; every other error as it is."""
    try:
        yield
    except S3Error as error:
        if error.code in MISSING_OBJECT_CODES:
            raise ObjectNotFound(key) from error
        raise


class StreamingUpload:
    """One object sent as its bytes arrive. Up to one part is held; a small object goes in one PUT at `finish`, a
    larger one as a multipart upload whose parts are each one blocking call with their bytes in hand. Each call runs
    to its end even when its caller stops waiting (a timeout, a cancel): `abort` waits for it, then drops what it made,
    so an upload given up part way leaves neither an incomplete multipart upload nor an object behind."""

    def __init__(self, store: ObjectStore, key: str, content_type: str, *, own_key: bool = False) -> None:
        self.store = store
        self.own_key = own_key
        """Nobody else writes this key: an object under it after a given-up `finish` is this upload's own."""
        self.key = key
        self.content_type = content_type
        self.pending = bytearray()
        self.upload_id: str | None = None
        self.parts: list[Part] = []
        self.finishing = False
        """`finish` began: the object may exist, whatever its caller heard."""
        self._step: asyncio.Future[object] | None = None
        """The blocking call under way (or the last one)."""

    async def write(self, chunk: bytes) -> None:
        self.pending += chunk
        if len(self.pending) >= UPLOAD_PART_BYTES:
            await self._send_part()

    async def finish(self) -> None:
        if self.upload_id is None:
            self.finishing = True
            await self._shielded(self.store.put_bytes(self.key, bytes(self.pending), self.content_type))
            return
        if self.pending:
            await self._send_part()
        self.finishing = True
        await self._shielded(self.store.run(self.store.client._complete_multipart_upload, self.store.bucket, self.key,
                                            self.upload_id, self.parts))

    async def abort(self) -> None:
        """Drop what was sent (best effort: a store that is down keeps an incomplete upload or the object, for the
        orphan sweep)."""
        if self._step is not None:
            await asyncio.wait([self._step])  # bounded by the store's timeouts
        with contextlib.suppress(S3Error, *TRANSIENT):
            if self.upload_id is not None:
                await self.store.run(self.store.client._abort_multipart_upload, self.store.bucket, self.key,
                                     self.upload_id)
            if self.finishing and self.own_key:  # else the key may hold an object another write stored
                await self.store.remove(self.key)

    async def _send_part(self) -> None:
        if self.upload_id is None:
            await self._shielded(self._create())
        data, self.pending = bytes(self.pending), bytearray()
        await self._shielded(self._upload_part(data, len(self.parts) + 1))

    async def _create(self) -> None:
        self.upload_id = await self.store.run(self.store.client._create_multipart_upload, self.store.bucket, self.key,
                                              {"Content-Type": self.content_type})

    async def _upload_part(self, data: bytes, number: int) -> None:
        etag = await self.store.run(self.store.client._upload_part, self.store.bucket, self.key, data, None,
                                    self.upload_id, number)
        self.parts.append(Part(number, etag))

    async def _shielded(self, call: Awaitable[object]) -> None:
        self._step = asyncio.ensure_future(call)
        await asyncio.shield(self._step)


async def opened(opening: Awaitable[urllib3.BaseHTTPResponse]) -> urllib3.BaseHTTPResponse:
    """A response opened in a thread. One its caller stops waiting for (a cancel) is released as soon as it opens,
    not left holding its connection until it is collected."""
    task = asyncio.ensure_future(opening)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(_release)
        raise


def _release(task: "asyncio.Future[urllib3.BaseHTTPResponse]") -> None:
    if not task.cancelled() and task.exception() is None:
        response = task.result()
        response.close()
        response.release_conn()


async def read_chunks(response: urllib3.BaseHTTPResponse,
                      run: Callable[[Callable[[int], bytes], int], Awaitable[bytes]] | None = None,
                      ) -> AsyncGenerator[bytes, None]:
    """An open response's body in bounded chunks, each read in a worker thread (`run`: the store's pool); the
    response released after."""
    try:
        while chunk := await (run(response.read, READ_CHUNK) if run else asyncio.to_thread(response.read, READ_CHUNK)):
            yield chunk
    finally:
        response.close()
        response.release_conn()


async def split_lines(chunks: AsyncIterator[bytes]) -> AsyncGenerator[bytes, None]:
    """The lines of a stream of chunks, without their line endings (the last line may lack one): `LineSplitter`'s.
    Closing it part way closes `chunks` (an object's connection is released then, not when collected)."""
    splitter = LineSplitter()
    try:
        async for chunk in chunks:
            for line in splitter.feed(chunk):
                yield line
    finally:
        await close_stream(chunks)
    for line in splitter.finish():
        yield line


async def read_within(chunks: AsyncIterator[bytes], limit: int) -> bytes | None:
    """An object's bytes, or None once they pass `limit` bytes (read no further: its connection is released)."""
    data = bytearray()
    try:
        async for chunk in chunks:
            data += chunk
            if len(data) > limit:
                return None
    finally:
        await close_stream(chunks)
    return bytes(data)


async def close_stream(chunks: object) -> None:
    """Release an object's body read part way (both stores' chunks and lines are async generators)."""
    close = getattr(chunks, "aclose", None)
    if close is not None:
        await close()
