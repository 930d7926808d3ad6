"""Key records and their users, cached a short while (a revocation counts once its fact is in the log, read model
or not): what authentication and the use cases look a caller up in."""

import time
from dataclasses import dataclass, field
from typing import TypeVar

from contracts.ids import hash_api_key
from contracts.readmodel import ApiKeyRecord, UserRecord
from services.runtime.nats.readmodel import ReadModel
from services.runtime.nats.revocations import RevocationCheck

Cached = TypeVar("Cached", ApiKeyRecord, UserRecord | None)
CACHE_TTL_S = 30.0
"""The longest a cached key is trusted; `forget` (driven by a watch on the read model) drops one at once."""
SWEEP_AT = 1024
"""Cached keys and users past which those older than `CACHE_TTL_S` are dropped (each would be read afresh anyway);
the next sweep waits until what is left has doubled, so a busy gateway does not scan on every lookup."""


@dataclass
class KeyCache:
    read_model: ReadModel
    revocations: RevocationCheck
    known: dict[str, tuple[float, ApiKeyRecord]] = field(default_factory=dict)
    users: dict[str, tuple[float, UserRecord | None]] = field(default_factory=dict)
    sweep_at: int = SWEEP_AT
    """Past this many entries (keys and users together), the stale ones are dropped."""

    async def lookup(self, api_key: str) -> ApiKeyRecord | None:
        digest = hash_api_key(api_key)
        cached = self.known.get(digest)
        if cached is not None and time.monotonic() - cached[0] < CACHE_TTL_S:
            record: ApiKeyRecord | None = cached[1]
        else:
            record = await self.read_model.get_api_key(digest)
            if record is not None:
                self._keep(self.known, digest, (time.monotonic(), record))
        # The read model lags the log (a paused ledger, forever): a revoke is final once its fact is stored.
        if record is not None and not record.revoked and await self.revocations.revoked(digest, record.key_id):
            record = record.model_copy(update={"revoked": True})
            self._keep(self.known, digest, (time.monotonic(), record))
        return record

    async def user_of(self, record: ApiKeyRecord) -> UserRecord | None:
        """The key's user (cached a short while); None for a key without a user, or one not in the read model."""
        if record.user_id is None:
            return None
        cached = self.users.get(record.user_id)
        if cached is None or time.monotonic() - cached[0] >= CACHE_TTL_S:
            cached = (time.monotonic(), await self.read_model.get_user(record.user_id))
            self._keep(self.users, record.user_id, cached)
        return cached[1]

    def _keep(self, table: dict[str, tuple[float, Cached]], ident: str, entry: tuple[float, Cached]) -> None:
        """Cache `entry`; a gateway meets new keys for years, so the stale go once the cache has grown."""
        table[ident] = entry
        if len(self.known) + len(self.users) > self.sweep_at:
            now = time.monotonic()
            _drop_stale(self.known, now)
            _drop_stale(self.users, now)
            self.sweep_at = max(SWEEP_AT, 2 * (len(self.known) + len(self.users)))

    def forget(self, read_model_key: str) -> None:
        """The read model changed this key or user: look it up afresh next time."""
        kind, _, ident = read_model_key.partition(".")
        (self.known if kind == "apikey" else self.users).pop(ident, None)


def _drop_stale(table: dict[str, tuple[float, Cached]], now: float) -> None:
    for stale in [ident for ident, (cached_at, _) in table.items() if now - cached_at >= CACHE_TTL_S]:
        del table[stale]
