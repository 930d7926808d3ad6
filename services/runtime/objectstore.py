"""The S3 object store (MinIO in production, SeaweedFS locally), reached through the `minio` client.

minio is blocking, so every call runs in a worker thread.
"""

import asyncio
import contextlib
import io
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import Protocol

import urllib3
from minio import Minio
from minio.error import S3Error

from services.runtime.settings import ConnectionSettings

log = logging.getLogger(__name__)

PART_SIZE = 16 * 1024 * 1024
READ_CHUNK = 256 * 1024


class Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


class ObjectNotFound(Exception):
    pass


class ObjectStore:
    def __init__(self, client: Minio, bucket: str) -> None:
        self.client = client
        self.bucket = bucket

    @classmethod
    def from_settings(cls, settings: ConnectionSettings) -> "ObjectStore":
        http = urllib3.PoolManager(
            num_pools=4, maxsize=16, timeout=urllib3.Timeout(connect=5, read=60),
            retries=urllib3.Retry(total=3, backoff_factor=0.2, status_forcelist=(500, 502, 503, 504)),
        )
        client = Minio(
            settings.s3_endpoint,
            access_key=settings.s3_access_key,
            secret_key=settings.s3_secret_key,
            secure=settings.s3_secure,
            http_client=http,
        )
        return cls(client, settings.s3_bucket)

    async def ensure_bucket(self, within_s: float = 30.0) -> None:
        """The server may refuse calls for a moment after it starts: retry until it answers."""
        await asyncio.to_thread(self._ensure_bucket, within_s)

    def _ensure_bucket(self, within_s: float) -> None:
        deadline = time.monotonic() + within_s
        while True:
            try:
                if not self.client.bucket_exists(self.bucket):
                    self.client.make_bucket(self.bucket)
                return
            except (S3Error, urllib3.exceptions.HTTPError, OSError) as error:
                if isinstance(error, S3Error) and error.code == "BucketAlreadyOwnedByYou":
                    return
                if time.monotonic() > deadline:
                    raise
                log.info("object store not ready yet: %s", error)
                time.sleep(0.3)

    async def put_stream(self, key: str, stream: Readable, content_type: str) -> None:
        """Upload from a blocking file-like object of unknown length, in multipart parts."""
        await asyncio.to_thread(
            self.client.put_object, self.bucket, key, stream, -1, content_type,  # type: ignore[arg-type]
            part_size=PART_SIZE,
        )

    async def put_bytes(self, key: str, data: bytes, content_type: str = "application/jsonl") -> None:
        await asyncio.to_thread(
            self.client.put_object, self.bucket, key, io.BytesIO(data), len(data), content_type
        )

    async def get_bytes(self, key: str) -> bytes:
        return await asyncio.to_thread(self._get_bytes, key)

    def _get_bytes(self, key: str) -> bytes:
        response = self._open(key)
        try:
            return response.read()
        finally:
            response.close()
            response.release_conn()

    def _open(self, key: str) -> urllib3.BaseHTTPResponse:
        try:
            return self.client.get_object(self.bucket, key)
        except S3Error as error:
            if error.code in ("NoSuchKey", "NoSuchObject"):
                raise ObjectNotFound(key) from error
            raise

    async def iter_chunks(self, key: str) -> AsyncIterator[bytes]:
        """Stream an object in bounded chunks without holding it whole in memory."""
        response = await asyncio.to_thread(self._open, key)
        async with contextlib.aclosing(read_chunks(response)) as chunks:
            async for chunk in chunks:
                yield chunk

    def iter_lines(self, key: str) -> AsyncIterator[bytes]:
        """Each line of an object, without its line ending (the last line may lack one)."""
        return split_lines(self.iter_chunks(key))

    async def list_keys(self, prefix: str) -> list[str]:
        return await asyncio.to_thread(self._list_keys, prefix)

    def _list_keys(self, prefix: str) -> list[str]:
        objects: Iterator = self.client.list_objects(self.bucket, prefix=prefix, recursive=True)
        return sorted(obj.object_name for obj in objects if obj.object_name)

    async def remove(self, key: str) -> None:
        await asyncio.to_thread(self.client.remove_object, self.bucket, key)


async def read_chunks(response: urllib3.BaseHTTPResponse) -> AsyncGenerator[bytes, None]:
    """An open response's body in bounded chunks, each read in a worker thread; the response released after."""
    try:
        while chunk := await asyncio.to_thread(response.read, READ_CHUNK):
            yield chunk
    finally:
        response.close()
        response.release_conn()


async def split_lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The lines of a stream of chunks, without their line endings (the last line may lack one)."""
    pending = b""
    async for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line.removesuffix(b"\r")
    if pending:
        yield pending.removesuffix(b"\r")
