"""How fast a client must send an upload's body while it holds a slot: something within the idle timeout, and at least
a minimum rate over each window, else 408 and the slot is free. Only time waiting for the client counts: while the
object store takes a part the clock stands still, so a slow store is never blamed on the client."""

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from services.gateway.usecases.refusals import ApiError

Result = TypeVar("Result")


def client_stalled(idle_s: float) -> ApiError:
    return ApiError(408, f"The upload sent no bytes for {idle_s:.0f}s; send the whole body (as its Content-Length "
                    "says) and try again.", code="request_timeout", param="file")


@dataclass
class BodyPace:
    """Reads of one request's body, each awaited through `read`; `received`: bytes of it arrived so far."""

    received: Callable[[], int]
    idle_s: float
    min_bytes_per_s: float
    window_s: float
    _waited_s: float = 0.0
    _window_start: int | None = None

    async def read(self, step: Awaitable[Result]) -> Result:
        """`step` (a read of the body), within what is left of the idle timeout and of the current window."""
        loop = asyncio.get_running_loop()
        if self._window_start is None:
            self._window_start = self.received()
        limit = self.idle_s
        if self.min_bytes_per_s > 0:
            limit = min(limit, max(0.0, self.window_s - self._waited_s))
        started = loop.time()
        try:
            async with asyncio.timeout(limit):
                result = await step
        except TimeoutError:
            raise (client_stalled(self.idle_s) if limit >= self.idle_s else self._too_slow()) from None
        finally:
            self._waited_s += loop.time() - started
        if self.min_bytes_per_s > 0:
            if self._sent() >= self.min_bytes_per_s * self.window_s:
                self._window_start, self._waited_s = self.received(), 0.0  # this window is paid: a new one starts
            elif self._waited_s >= self.window_s:
                raise self._too_slow()
        return result

    def _sent(self) -> int:
        return self.received() - (self._window_start or 0)

    def _too_slow(self) -> ApiError:
        return ApiError(408, f"The upload sent {self._sent()} bytes in {self.window_s:g}s, slower than the minimum of "
                        f"{self.min_bytes_per_s:g} bytes a second; send the body faster and try again.",
                        code="request_timeout", param="file")
