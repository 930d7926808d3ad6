"""Whether a key is revoked, read from the fact log itself: a revoke counts the moment its fact is stored, however
far the ledger's read model lags. Gateways ask on every request, the broker's auth callout at every admission."""

from collections import OrderedDict
from dataclasses import dataclass, field

from contracts.events.key import KeyRevoked
from contracts.ids import key_aggregate_id
from contracts.subjects import EVENTS_STREAM, key_fact
from services.runtime.nats.bus import EventBus
from services.runtime.nats.facts import last_fact

MAX_REMEMBERED = 100_000
"""Revoked keys remembered per process; past this the oldest are asked about afresh (memory stays bounded)."""


async def revoked(bus: EventBus, key_sha256: str, key_id: str, *, direct: bool = False) -> bool:
    """True once a `key.revoked` fact for this key (`key_id` as its read model record gives it) is in EVENTS. By
    default a stream-leader read, which no acknowledged revoke can miss; `direct` (cheaper, outside the JetStream API
    queue) only on a single-replica stream, where a lagging replica cannot answer. A broker that does not answer
    raises: callers refuse rather than admit a key they could not check."""
    found = await last_fact(bus, key_fact(key_aggregate_id(key_id, key_sha256), "revoked"), direct=direct)
    # The subject names the key by its id (or, for an old key, 128 bits of its digest); the fact names the key.
    return found is not None and isinstance(found[1], KeyRevoked) and found[1].key_sha256 == key_sha256


@dataclass
class RevocationCheck:
    """`revoked` with the revoked keys remembered: a revocation is final, so only a "revoked" answer is kept."""

    bus: EventBus
    direct: bool = False
    known_revoked: OrderedDict[str, None] = field(default_factory=OrderedDict)

    @classmethod
    async def open(cls, bus: EventBus) -> "RevocationCheck":
        """Direct gets where they cannot miss an acknowledged fact: EVENTS allows them and has one replica."""
        config = (await bus.js.stream_info(EVENTS_STREAM)).config
        return cls(bus, direct=bool(config.allow_direct) and (config.num_replicas or 1) == 1)

    async def revoked(self, key_sha256: str, key_id: str) -> bool:
        if key_sha256 in self.known_revoked:
            return True
        if not await revoked(self.bus, key_sha256, key_id, direct=self.direct):
            return False
        self.known_revoked[key_sha256] = None
        while len(self.known_revoked) > MAX_REMEMBERED:
            self.known_revoked.popitem(last=False)
        return True
