"""Refusal pacing: a client past a budget of refusals (401, 403, 429) gets its next ones answered late, so one looping
on them waits instead of taking the event loop from other tenants. Paced by owner once authenticated, else by
address (IPv6 by /64); per process, in memory, at most `MAX_CLIENTS` clients (a load guard, nothing to share)."""

import asyncio
import ipaddress
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from aiohttp import web
from aiohttp.typedefs import Handler

from services.gateway.http.auth import REQUEST_PRINCIPAL
from services.gateway.http.errors import CLIENT_CLOSED_REQUEST

PACED_STATUSES = frozenset({401, 403, 429})
MAX_CLIENTS = 100_000
"""Clients tracked; the least recently refused go first."""
MAX_WAITING = 256
"""Refusals one client may have waiting at once; past it, its connection is closed without an answer."""
IPV6_PREFIX = 64


def client_of(address: str, owner: str | None) -> str:
    """Whom a refusal counts against: the owner when the caller authenticated, else its address (IPv6 by /64)."""
    if owner is not None:
        return f"owner:{owner}"
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return f"address:{address}"
    if parsed.version == 6:
        return f"address:{ipaddress.ip_network(f'{parsed}/{IPV6_PREFIX}', strict=False)}"
    return f"address:{parsed}"


class Dropped(Exception):
    """The client is past its waiting cap: its connection is closed without an answer."""


@dataclass
class RefusalPacer:
    budget: int
    """Refusals a client gets at once within a window of `window_s`; 0 turns pacing off."""
    window_s: float
    delay_s: float
    windows: OrderedDict[str, tuple[float, int]] = field(default_factory=OrderedDict)
    """Per client: when its current window began, and the refusals counted in it."""
    waiting: dict[str, int] = field(default_factory=dict)

    def _count(self, client: str, now: float) -> int:
        began, count = self.windows.pop(client, (now, 0))
        if now - began >= self.window_s:
            began, count = now, 0
        self.windows[client] = (began, count + 1)
        if len(self.windows) > MAX_CLIENTS:
            self.windows.popitem(last=False)
        return count + 1

    async def pace(self, client: str, response: web.StreamResponse) -> None:
        """Wait before a refusal goes out, if its client is past its budget; Dropped past its waiting cap."""
        if self.budget <= 0 or response.status not in PACED_STATUSES:
            return
        if self._count(client, time.monotonic()) <= self.budget:
            return
        if self.waiting.get(client, 0) >= MAX_WAITING:
            raise Dropped(client)
        self.waiting[client] = self.waiting.get(client, 0) + 1
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self.waiting[client] -= 1
            if not self.waiting[client]:
                del self.waiting[client]


REFUSAL_PACER = web.AppKey("refusal_pacer", RefusalPacer)


@web.middleware
async def pacing_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Outside the error middleware: every refusal, already in OpenAI's shape, goes out paced."""
    response = await handler(request)
    pacer = request.app.get(REFUSAL_PACER)
    if pacer is None or response.status not in PACED_STATUSES:
        return response
    caller = request.get(REQUEST_PRINCIPAL)
    try:
        await pacer.pace(client_of(request.remote or "unknown", caller.owner if caller else None), response)
    except Dropped:
        if request.transport is not None:
            request.transport.abort()  # past its cap of refusals waiting: no answer at all
        return web.Response(status=CLIENT_CLOSED_REQUEST)
    return response
