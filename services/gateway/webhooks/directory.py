"""The webhook endpoints each gateway keeps in memory, by a watch on the bucket's endpoint keys and indexed by who
receives and who manages what: a batch fact or a caller's list looks up only its owner's and organisation's
endpoints, never every tenant's. A lookup is exact: it first asks the bucket for its newest endpoint write and waits
until the watch has applied it. What is kept is what routing needs (no URL, no secret); an attempt or a list reads
its endpoints from the bucket as they are then."""

import asyncio
from collections import defaultdict
from dataclasses import dataclass, field

from nats.js.kv import KeyValue

from contracts.api.webhook import WebhookEndpoint, WebhookEventType
from services.gateway.webhooks.domain import receives
from services.gateway.webhooks.store import ENDPOINT
from services.runtime.nats.bus import NotYet
from services.runtime.nats.kv import Bucket, newest_sequence
from services.runtime.nats.kv_watch import decoded, keep

READY_WAIT_S = 10.0
"""How long a lookup waits for the directory to hold every endpoint (at start, after a broken watch)."""


class DirectoryNotReady(NotYet):
    """The directory has not read every endpoint yet (a gateway starting, or its watch resuming): ask again later."""


@dataclass
class Endpoints:
    """Endpoints by id, and the ids each batch owner's and organisation's facts are looked up by."""

    by_id: dict[str, WebhookEndpoint] = field(default_factory=dict)
    of_owner: defaultdict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    """Every endpoint under the owner who registered it (whatever its scope)."""
    of_organization: defaultdict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    """An organisation-wide endpoint under its organisation."""
    wanted: defaultdict[WebhookEventType, int] = field(default_factory=lambda: defaultdict(int))
    """Enabled endpoints per event type: a fact no endpoint wants costs no read at all."""
    applied: int = 0
    """The newest stream sequence of an endpoint write these hold."""

    def put(self, endpoint_id: str, endpoint: WebhookEndpoint | None, sequence: int = 0) -> None:
        """The endpoint as written at `sequence` (None: deleted)."""
        self.applied = max(self.applied, sequence)
        self._drop(endpoint_id)
        if endpoint is None:
            return
        endpoint = endpoint.model_copy(update={"url": "", "description": "", "secret": None})  # routing only
        self.by_id[endpoint_id] = endpoint
        self.of_owner[endpoint.owner].add(endpoint_id)
        if endpoint.scope == "organization":
            self.of_organization[endpoint.organization_id].add(endpoint_id)
        if endpoint.enabled:
            for event_type in set(endpoint.events):
                self.wanted[event_type] += 1

    def _drop(self, endpoint_id: str) -> None:
        old = self.by_id.pop(endpoint_id, None)
        if old is None:
            return
        _unindex(self.of_owner, old.owner, endpoint_id)
        if old.scope == "organization":
            _unindex(self.of_organization, old.organization_id, endpoint_id)
        if old.enabled:
            for event_type in set(old.events):
                self.wanted[event_type] -= 1

    def counted_with(self, endpoint: WebhookEndpoint) -> set[str]:
        """The ids of the endpoints counted against the same limit as `endpoint` (its owner's user-scoped ones, or
        its organisation's organisation-wide ones)."""
        if endpoint.scope == "organization":
            return set(self.of_organization.get(endpoint.organization_id, ()))
        return {endpoint_id for endpoint_id in self.of_owner.get(endpoint.owner, ())
                if self.by_id[endpoint_id].scope == "user"}

    def managed_by(self, owner: str, organization: str | None) -> list[str]:
        """The ids of the endpoints `owner` registered and, for an organisation's administrator, its
        organisation-wide ones, in id order."""
        ids = set(self.of_owner.get(owner, ()))
        if organization is not None:
            ids |= self.of_organization.get(organization, set())
        return sorted(ids)

    def receivers(self, event_type: WebhookEventType, owner: str, organization: str | None,
                  occurred_at_ms: int) -> list[WebhookEndpoint]:
        """The endpoints sent this event of a batch of `owner` (of `organization`), in id order."""
        found = [self.by_id[endpoint_id] for endpoint_id in self.managed_by(owner, organization)]
        return [endpoint for endpoint in found if receives(endpoint, event_type, owner, organization, occurred_at_ms)]


@dataclass
class EndpointDirectory:
    """The endpoints as the bucket holds them (a `Keeper` of its endpoint keys); each (re)watch rebuilds them on the
    side and replaces them whole once it has read every current one."""

    endpoints: Endpoints = field(default_factory=Endpoints)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    """Set while the watch holds every endpoint written so far."""
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    """Set as the watch applies writes (a waiter clears it before it looks)."""
    reading: Endpoints = field(default_factory=Endpoints)
    """What the watch has shown so far (`endpoints` itself once it has shown every current one)."""

    async def current_endpoints(self, bucket: Bucket, wait_s: float = READY_WAIT_S) -> Endpoints:
        """The endpoints with every endpoint write acknowledged before the call; `DirectoryNotReady` when the watch
        has not applied them within `wait_s`."""
        newest = await newest_sequence(bucket.js, bucket.stream, f"{bucket.prefix}{ENDPOINT}.*")
        return await self.holding(newest, wait_s)

    async def holding(self, newest: int, wait_s: float = READY_WAIT_S) -> Endpoints:
        """The endpoints once the watch holds every current one and has applied the write at `newest`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            self.changed.clear()
            if self.ready.is_set() and self.endpoints.applied >= newest:
                return self.endpoints
            try:
                await asyncio.wait_for(self.changed.wait(), max(deadline - loop.time(), 0))
            except TimeoutError:
                raise DirectoryNotReady(f"the webhook endpoints were not read within {wait_s:g}s") from None

    def owner_of(self, endpoint_id: str) -> str | None:
        endpoint = self.endpoints.by_id.get(endpoint_id)
        return None if endpoint is None else endpoint.owner

    def restart(self) -> None:
        self.reading = Endpoints()

    def put(self, key: str, value: bytes | None, revision: int) -> None:
        self.reading.put(key.removeprefix(f"{ENDPOINT}."), decoded(WebhookEndpoint, key, value, "a webhook endpoint"),
                         revision)
        self.changed.set()

    def current(self) -> None:
        self.endpoints = self.reading
        self.ready.set()
        self.changed.set()

    def lost(self) -> None:
        self.ready.clear()

    async def follow(self, kv: KeyValue) -> None:
        """Keep the endpoints as the bucket changes, until cancelled; a broken watch is made again."""
        await keep(kv, f"{ENDPOINT}.*", self, "the webhook endpoints")


def _unindex(index: defaultdict[str, set[str]], holder: str, endpoint_id: str) -> None:
    ids = index.get(holder)
    if ids is not None:
        ids.discard(endpoint_id)
        if not ids:
            del index[holder]
