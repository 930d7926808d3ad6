"""Objects reached through presigned URLs from the object broker (the leading scheduler), for an executor without S3
credentials. urllib3 is blocking, so every transfer runs in a worker thread; reads stream in bounded chunks."""

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Sequence
from pathlib import Path

import urllib3
from nats.aio.client import Client

from contracts.catalogue import MODEL_OBJECTS_PREFIX
from contracts.objects import AHEAD, ObjectGrant, ObjectOperation, ObjectRequest, WantedObject, chunk_attempt
from contracts.subjects import object_requests
from services.executor.adapters.desk import ask_until_answered
from services.runtime.process.logfmt import BATCH_ID
from services.runtime.storage.objectstore import ObjectNotFound, https_pool, opened, read_chunks, split_lines
from services.runtime.storage.write_failures import SAID_CHARS, ObjectStoreAnswered

URL_MARGIN_S = 60.0
"""A URL from a listing is used only while it has this long left; else a fresh one is asked for."""


class ObjectAccessRefused(PermissionError):
    """The broker refused: the object is not part of this executor's work."""


class ObjectBrokerUnavailable(ConnectionError):
    """No scheduler answered (or could judge) within the wait: none leads, or a new leader is catching up."""


class ObjectTransferFailed(ObjectStoreAnswered):
    """The object store answered a presigned request with an error (a full or failing one is waited out)."""


def http_pool(ca: Path | None = None) -> urllib3.PoolManager:
    """For presigned URLs: an https:// one is verified against the system's CAs and `ca` (the deployment's)."""
    return https_pool(
        ca, num_pools=4, maxsize=16, timeout=urllib3.Timeout(connect=5, read=60),
        retries=urllib3.Retry(total=3, backoff_factor=0.2, status_forcelist=(500, 502, 503, 504)),
    )


def batch_of(key: str) -> str:
    """The batch a key belongs to: named in it (result chunks, rejections), else the command in hand's."""
    if key.startswith(MODEL_OBJECTS_PREFIX):
        return ""  # model weights belong to no batch: every executor of the fleet may read them
    kind, _, rest = key.partition("/")
    if kind in ("results", "validation") and "/" in rest:
        return rest.split("/", 1)[0]
    batch_id = BATCH_ID.get()
    if not batch_id:
        raise ObjectAccessRefused(f"{key} is not reached outside a batch's work")
    return batch_id


class BrokeredObjectStore:
    def __init__(self, nc: Client, executor_id: str, http: urllib3.PoolManager, wait_s: float = 60.0) -> None:
        self.nc = nc
        self.subject = object_requests(executor_id)
        self.http = http
        self.wait_s = wait_s
        self.granted: dict[tuple[ObjectOperation, str], tuple[str, float]] = {}
        """(get or put, key) → (URL, monotonic expiry), from listings and asked ahead, each for one use."""

    async def get_bytes(self, key: str) -> bytes:
        url = await self._url("get", key)
        return await asyncio.to_thread(self._read_all, url, key)

    async def iter_chunks(self, key: str) -> AsyncGenerator[bytes, None]:
        url = await self._url("get", key)
        response = await opened(asyncio.to_thread(self._open, url, key))
        async with contextlib.aclosing(read_chunks(response)) as chunks:
            async for chunk in chunks:
                yield chunk

    def iter_lines(self, key: str) -> AsyncGenerator[bytes, None]:
        return split_lines(self.iter_chunks(key))

    async def put_bytes(self, key: str, data: bytes, content_type: str = "application/jsonl") -> None:
        chunk = chunk_attempt(key)
        url = await self._url("put", key, attempt=chunk[1] if chunk else 0)
        await asyncio.to_thread(self._put, url, key, data, content_type)

    async def list_keys(self, prefix: str) -> list[str]:
        keys: list[str] = []
        after: str | None = ""
        while after is not None:
            grant = await self._ask(ObjectRequest(operation="list", batch_id=batch_of(prefix), key=prefix,
                                                  start_after=after))
            expires_at = time.monotonic() + grant.expires_in_s
            for listed in grant.objects:
                keys.append(listed.key)
                self.granted["get", listed.key] = (listed.url, expires_at)
            after = grant.next_after
        self._forget_expired()
        return sorted(keys)

    async def ask_ahead(self, batch_id: str, attempt: int, wanted: Sequence[WantedObject]) -> None:
        """Ask in one request for the URLs of the objects an attempt gets or puts soon (refusals wait for the use)."""
        if not wanted:
            return
        first, *rest = wanted
        try:
            grant = await self._ask(ObjectRequest(operation=first.operation, batch_id=batch_id, key=first.key,
                                                  attempt=attempt, ahead=rest[:AHEAD]))
        except ObjectAccessRefused:
            return  # the use itself is refused, where its caller knows what that means
        self._forget_expired()
        expires_at = time.monotonic() + grant.expires_in_s
        assert grant.url is not None, "a granted get or put carries its URL"
        self.granted[first.operation, first.key] = (grant.url, expires_at)
        for granted in grant.ahead:
            self.granted[granted.operation, granted.key] = (granted.url, expires_at)

    async def _url(self, operation: ObjectOperation, key: str, attempt: int = 0) -> str:
        url, expires_at = self.granted.pop((operation, key), ("", 0.0))
        if url and expires_at - time.monotonic() > URL_MARGIN_S:
            return url
        grant = await self._ask(ObjectRequest(operation=operation, batch_id=batch_of(key), key=key, attempt=attempt))
        assert grant.url is not None, "a granted get or put carries its URL"
        return grant.url

    async def _ask(self, request: ObjectRequest) -> ObjectGrant:
        what = f"{request.operation} {request.key}"

        def judged(data: bytes) -> tuple[ObjectGrant | None, str]:
            grant = ObjectGrant.model_validate_json(data)
            if not grant.granted and not grant.retry:
                raise ObjectAccessRefused(f"{what}: {grant.reason}")
            return (grant, "") if grant.granted else (None, grant.reason or "the broker cannot judge yet")

        return await ask_until_answered(self.nc, self.subject, request.model_dump_json().encode(), judged,
                                        self.wait_s, what, ObjectBrokerUnavailable)

    def _forget_expired(self) -> None:
        now = time.monotonic()
        for key in [key for key, (_, expires_at) in self.granted.items() if expires_at - now <= URL_MARGIN_S]:
            del self.granted[key]

    def _open(self, url: str, key: str) -> urllib3.BaseHTTPResponse:
        response = self.http.request("GET", url, preload_content=False)
        if response.status != 200:
            said = response.read(SAID_CHARS).decode(errors="replace")
            _release(response)
            if response.status == 404:
                raise ObjectNotFound(key)
            raise ObjectTransferFailed(f"GET {key}", response.status, said)
        return response

    def _read_all(self, url: str, key: str) -> bytes:
        response = self._open(url, key)
        try:
            return response.read()
        finally:
            _release(response)

    def _put(self, url: str, key: str, data: bytes, content_type: str) -> None:
        response = self.http.request("PUT", url, body=data, headers={"Content-Type": content_type})
        if response.status != 200:
            raise ObjectTransferFailed(f"PUT {key}", response.status, response.data.decode(errors="replace"))


def _release(response: urllib3.BaseHTTPResponse) -> None:
    response.close()
    response.release_conn()
