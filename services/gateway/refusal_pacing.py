"""Refusal pacing: a client address that gets many refusals (401, 403, 429) in a short while gets its next ones
answered late, so a client looping on refused requests (a scanner, a scraper without a key) spends its own time
waiting instead of the gateway's event loop answering it thousands of times a second, and other tenants' requests
keep their latency. Answers that succeed, and other errors, are never delayed.

Per gateway process, in memory (a load guard, not a limit: nothing to share), bounded by `MAX_ADDRESSES`.
"""

import asyncio
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from aiohttp import web

PACED_STATUSES = frozenset({401, 403, 429})
MAX_ADDRESSES = 10_000
"""Addresses tracked; the least recently refused go first."""
MAX_WAITING = 256
"""Refusals one address may have waiting at once; past it, answered at once and their connection closed."""


@dataclass
class RefusalPacer:
    budget: int
    """Refusals an address gets at once within `window_s`; 0 turns pacing off."""
    window_s: float
    delay_s: float
    seen: OrderedDict[str, deque[float]] = field(default_factory=OrderedDict)
    waiting: dict[str, int] = field(default_factory=dict)

    def _count(self, address: str, now: float) -> int:
        times = self.seen.pop(address, None) or deque()
        while times and times[0] <= now - self.window_s:
            times.popleft()
        times.append(now)
        while len(times) > self.budget + 1:
            times.popleft()  # only whether it is past the budget matters
        self.seen[address] = times
        if len(self.seen) > MAX_ADDRESSES:
            self.seen.popitem(last=False)
        return len(times)

    async def pace(self, address: str, response: web.StreamResponse) -> None:
        """Wait before a refusal goes out, if its address is past its budget."""
        if self.budget <= 0 or response.status not in PACED_STATUSES:
            return
        if self._count(address, time.monotonic()) <= self.budget:
            return
        if self.waiting.get(address, 0) >= MAX_WAITING:
            response.force_close()
            return
        self.waiting[address] = self.waiting.get(address, 0) + 1
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self.waiting[address] -= 1
            if not self.waiting[address]:
                del self.waiting[address]


REFUSAL_PACER = web.AppKey("refusal_pacer", RefusalPacer)
