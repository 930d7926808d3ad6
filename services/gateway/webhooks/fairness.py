"""Fair delivery, without I/O: the order a gateway tries to start due deliveries in (round-robin across owners, each
owner's oldest first), how many attempts it runs at once per owner and per endpoint, and a circuit breaker per
endpoint that defers the deliveries of one that keeps failing. All of it is one gateway's, in its memory."""

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Breaker:
    failures: int = 0
    """Consecutive failed attempts."""
    open_until: float = 0.0
    probing: bool = False
    """Half-open: the one attempt that decides whether it closes is running."""
    failed_at: float = 0.0
    """When its last attempt failed."""


BREAKER_FORGOTTEN_S = 3600.0
"""A breaker whose endpoint has had no attempt fail for this long (nor more than its cooldown) is forgotten: its
endpoint was deleted, or has nothing due; the next failures open it again."""


@dataclass
class Fairness:
    owner_limit: int
    endpoint_limit: int
    breaker_failures: int
    cooldown_s: float
    by_owner: Counter[str] = field(default_factory=Counter)
    by_endpoint: Counter[str] = field(default_factory=Counter)
    breakers: dict[str, Breaker] = field(default_factory=dict)

    def is_open(self, endpoint_id: str) -> bool:
        breaker = self.breakers.get(endpoint_id)
        return breaker is not None and breaker.failures >= self.breaker_failures

    def may_start(self, endpoint_id: str, owner: str, now: float) -> bool:
        """Whether an attempt may start now: owner and endpoint have a free slot, and the breaker is closed, or
        half-open with no probe running."""
        if self.by_owner[owner] >= self.owner_limit or self.by_endpoint[endpoint_id] >= self.endpoint_limit:
            return False
        if not self.is_open(endpoint_id):
            return True
        breaker = self.breakers[endpoint_id]
        return now >= breaker.open_until and not breaker.probing and self.by_endpoint[endpoint_id] == 0

    def started(self, endpoint_id: str, owner: str) -> None:
        self.by_owner[owner] += 1
        self.by_endpoint[endpoint_id] += 1
        if self.is_open(endpoint_id):
            self.breakers[endpoint_id].probing = True

    def ended(self, endpoint_id: str, owner: str, succeeded: bool | None, now: float) -> None:
        """An attempt ended: `succeeded` None when it says nothing of the endpoint (deleted, not recorded)."""
        for counter, key in ((self.by_owner, owner), (self.by_endpoint, endpoint_id)):
            counter[key] -= 1
            if counter[key] <= 0:
                del counter[key]
        breaker = self.breakers.get(endpoint_id)
        if breaker is not None:
            breaker.probing = False
        if succeeded is None:
            return
        if succeeded:
            self.breakers.pop(endpoint_id, None)
            return
        breaker = self.breakers.get(endpoint_id)
        if breaker is None:
            self._forget_stale_breakers(now)
            breaker = self.breakers[endpoint_id] = Breaker()
        breaker.failures += 1
        breaker.failed_at = now
        if breaker.failures >= self.breaker_failures:
            breaker.open_until = now + self.cooldown_s

    def _forget_stale_breakers(self, now: float) -> None:
        stale_s = max(BREAKER_FORGOTTEN_S, self.cooldown_s * 2)
        for endpoint_id in [endpoint_id for endpoint_id, breaker in self.breakers.items()
                            if not breaker.probing and now - breaker.failed_at > stale_s]:
            del self.breakers[endpoint_id]
