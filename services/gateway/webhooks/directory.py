"""The webhook endpoints each gateway keeps in memory, by a watch on the bucket's endpoint keys and indexed by who
receives what: a batch fact looks up only its owner's and organisation's endpoints, never every tenant's. What is kept
is what routing needs (no URL, no secret); an attempt reads its endpoint from the bucket as it is then."""

import asyncio
import contextlib
import logging
from collections import defaultdict
from dataclasses import dataclass, field

import nats.errors
import nats.js.errors
import pydantic
from nats.js.kv import KeyValue

from contracts.api.webhook import WebhookEndpoint, WebhookEventType
from services.gateway.webhooks.domain import receives
from services.gateway.webhooks.store import ENDPOINT

log = logging.getLogger(__name__)

RESUME_AFTER_S = 1.0
"""The pause before a broken watch is made again."""
READY_WAIT_S = 10.0
"""How long a lookup waits for the directory to hold every endpoint (at start, after a broken watch)."""


class DirectoryNotReady(Exception):
    """The directory has not read every endpoint yet (a gateway starting, or its watch resuming): ask again later."""


@dataclass
class Endpoints:
    """Endpoints by id, and the ids each batch owner's and organisation's facts are looked up by."""

    by_id: dict[str, WebhookEndpoint] = field(default_factory=dict)
    of_owner: defaultdict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    """A user-scoped endpoint under its owner."""
    of_organization: defaultdict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    """An organisation-wide endpoint under its organisation."""
    wanted: defaultdict[WebhookEventType, int] = field(default_factory=lambda: defaultdict(int))
    """Enabled endpoints per event type: a fact no endpoint wants costs no read at all."""

    def put(self, endpoint_id: str, endpoint: WebhookEndpoint | None) -> None:
        """The endpoint as written now (None: deleted)."""
        self._drop(endpoint_id)
        if endpoint is None:
            return
        endpoint = endpoint.model_copy(update={"url": "", "description": "", "secret": None})  # routing only
        self.by_id[endpoint_id] = endpoint
        index, holder = self._holder(endpoint)
        index[holder].add(endpoint_id)
        if endpoint.enabled:
            for event_type in set(endpoint.events):
                self.wanted[event_type] += 1

    def _drop(self, endpoint_id: str) -> None:
        old = self.by_id.pop(endpoint_id, None)
        if old is None:
            return
        index, holder = self._holder(old)
        ids = index[holder]
        ids.discard(endpoint_id)
        if not ids:
            del index[holder]
        if old.enabled:
            for event_type in set(old.events):
                self.wanted[event_type] -= 1

    def _holder(self, endpoint: WebhookEndpoint) -> tuple[defaultdict[str, set[str]], str]:
        if endpoint.scope == "user":
            return self.of_owner, endpoint.owner
        return self.of_organization, endpoint.organization_id

    def receivers(self, event_type: WebhookEventType, owner: str, organization: str | None,
                  occurred_at_ms: int) -> list[WebhookEndpoint]:
        """The endpoints sent this event of a batch of `owner` (of `organization`), in id order."""
        ids = set(self.of_owner.get(owner, ()))
        if organization is not None:
            ids |= self.of_organization.get(organization, set())
        found = [self.by_id[endpoint_id] for endpoint_id in sorted(ids)]
        return [endpoint for endpoint in found if receives(endpoint, event_type, owner, organization, occurred_at_ms)]


@dataclass
class EndpointDirectory:
    """The endpoints as the bucket holds them, kept by `follow`; each (re)watch rebuilds them on the side and
    replaces them whole once it has read every current one."""

    endpoints: Endpoints = field(default_factory=Endpoints)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    """Set while the watch holds every endpoint written so far."""

    async def current(self, wait_s: float = READY_WAIT_S) -> Endpoints:
        """The endpoints, once the watch holds them all; `DirectoryNotReady` after `wait_s` without."""
        if not self.ready.is_set():
            try:
                await asyncio.wait_for(self.ready.wait(), wait_s)
            except TimeoutError:
                raise DirectoryNotReady(f"the webhook endpoints were not read within {wait_s:g}s") from None
        return self.endpoints

    def owner_of(self, endpoint_id: str) -> str | None:
        endpoint = self.endpoints.by_id.get(endpoint_id)
        return None if endpoint is None else endpoint.owner

    async def follow(self, kv: KeyValue) -> None:
        """Keep the endpoints as the bucket changes, until cancelled; a broken watch is made again."""
        prefix = f"{ENDPOINT}."
        while True:
            try:
                watcher = await kv.watch(f"{ENDPOINT}.*")
                reading = Endpoints()
                try:
                    async for entry in watcher:
                        if entry is None:  # the end of the current values
                            self.endpoints = reading
                            self.ready.set()
                            continue
                        reading.put(entry.key.removeprefix(prefix), decode(entry.key, entry.value))
                finally:
                    self.ready.clear()
                    with contextlib.suppress(nats.errors.Error, nats.js.errors.Error):
                        await watcher.stop()
            except (nats.errors.Error, nats.js.errors.Error) as error:
                log.warning("the webhook endpoints' watch was interrupted, resuming: %r", error)
            await asyncio.sleep(RESUME_AFTER_S)


def decode(key: str, value: bytes | None) -> WebhookEndpoint | None:
    if not value:
        return None
    try:
        return WebhookEndpoint.model_validate_json(value)
    except pydantic.ValidationError:
        log.warning("the webhook endpoint at %s does not decode; it receives nothing", key)
        return None
