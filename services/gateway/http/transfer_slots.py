"""Transfer slots per gateway process (in memory), shared fairly: uploads (or downloads) at once, a few per owner,
waiters served owner by owner; a cap on one address's uploads in flight, counted before its key is looked at; and one
on an owner's event streams open at once.
Every count comes back on every path (an answer, an error, a client gone, a cancelled handler)."""

import asyncio
import contextlib
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

from aiohttp import web
from aiohttp.typedefs import Handler

from services.gateway.usecases.refusals import ApiError


def server_busy() -> ApiError:
    return ApiError(503, "The server is busy with other transfers; retry shortly.", "server_error", "server_busy",
                    retry_after_s=5)


@dataclass
class FairSlots:
    """At most `slots` transfers at once, `per_owner` of them one owner's; one without a slot waits in its owner's
    line up to `wait_s` (then 503), freed slots going to owners in turn: none waits behind another's line."""

    slots: int
    per_owner: int
    wait_s: float
    in_use: int = 0
    held: dict[str, int] = field(default_factory=dict)
    """Slots in use, by owner (owners holding none are not kept)."""
    lines: OrderedDict[str, deque[asyncio.Future[None]]] = field(default_factory=OrderedDict)
    """The waiting transfers of each owner that has some, owners in the order they are served next."""

    def waiting(self) -> int:
        return sum(len(line) for line in self.lines.values())

    @contextlib.asynccontextmanager
    async def slot(self, owner: str) -> AsyncIterator[None]:
        await self._acquire(owner)
        try:
            yield
        finally:
            self._release(owner)

    def _may_take(self, owner: str) -> bool:
        return self.in_use < self.slots and self.held.get(owner, 0) < min(self.per_owner, self.slots)

    def _take(self, owner: str) -> None:
        self.in_use += 1
        self.held[owner] = self.held.get(owner, 0) + 1

    async def _acquire(self, owner: str) -> None:
        if owner not in self.lines and self._may_take(owner):
            self._take(owner)
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.lines.setdefault(owner, deque()).append(granted)
        try:
            async with asyncio.timeout(self.wait_s):
                await granted
        except BaseException as stopped:
            if granted.done() and not granted.cancelled():
                self._release(owner)  # the slot came as the wait ended: pass it on
            else:
                self._leave_line(owner, granted)
            if isinstance(stopped, TimeoutError):
                raise server_busy() from None
            raise

    def _leave_line(self, owner: str, granted: asyncio.Future[None]) -> None:
        line = self.lines.get(owner)
        if line is not None and granted in line:
            line.remove(granted)
            if not line:
                del self.lines[owner]

    def _release(self, owner: str) -> None:
        self.in_use -= 1
        self.held[owner] -= 1
        if not self.held[owner]:
            del self.held[owner]
        self._serve()

    def _serve(self) -> None:
        """Hand free slots to the waiting owners in turn, each served owner going to the back."""
        while self.in_use < self.slots:
            owner = next((o for o in self.lines if self._may_take(o)), None)
            if owner is None:
                return
            line = self.lines[owner]
            granted = line.popleft()
            if line:
                self.lines.move_to_end(owner)
            else:
                del self.lines[owner]
            if granted.done():  # its wait was cancelled a moment ago; its handler has not run since
                continue
            self._take(owner)
            granted.set_result(None)


@dataclass
class AtOnce:
    """At most `cap` requests of one key (an address's uploads, an owner's event streams) at once on this gateway
    (0: no cap); one past it gets `refusal(cap)`, a 429. Each count comes back when its request ends."""

    cap: int
    refusal: Callable[[int], ApiError]
    counts: dict[str, int] = field(default_factory=dict)

    @contextlib.contextmanager
    def holding(self, key: str) -> Iterator[None]:
        if self.cap > 0 and self.counts.get(key, 0) >= self.cap:
            raise self.refusal(self.cap)
        self.counts[key] = self.counts.get(key, 0) + 1
        try:
            yield
        finally:
            self.counts[key] -= 1
            if not self.counts[key]:
                del self.counts[key]


def too_many_uploads(cap: int) -> ApiError:
    """An address's uploads in flight, counted before its key is looked at."""
    return ApiError(429, f"Too many uploads from this address at once (at most {cap}); finish some first.",
                    "rate_limit_error", "too_many_uploads", retry_after_s=5)


def too_many_streams(cap: int) -> ApiError:
    """An owner's event streams: each holds a consumer on the broker every tenant shares."""
    return ApiError(429, f"At most {cap} event streams may be open at once on one gateway; close one first.",
                    "rate_limit_error", "too_many_streams", retry_after_s=5)


UPLOAD_SLOTS = web.AppKey("upload_slots", FairSlots)
DOWNLOAD_SLOTS = web.AppKey("download_slots", FairSlots)
UPLOADS_IN_FLIGHT = web.AppKey("uploads_in_flight", AtOnce)
OPEN_STREAMS = web.AppKey("open_streams", AtOnce)
UPLOAD_PATH = "/v1/files"


@web.middleware
async def upload_address_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Counts an upload against its address before the auth middleware looks at its key."""
    if request.method != "POST" or request.path != UPLOAD_PATH:
        return await handler(request)
    with request.app[UPLOADS_IN_FLIGHT].holding(request.remote or "unknown"):
        return await handler(request)
