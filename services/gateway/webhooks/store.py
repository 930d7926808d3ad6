"""The webhooks bucket: endpoints, deliveries with their attempts, and the deliveries due. A gateway claims a due one
by compare-and-set (moving it a lease ahead), so two never attempt it at once; one that dies leaves the claim to
lapse. Lists use direct gets, leaving no consumer behind; ended deliveries are pruned after their retention."""

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import nats.js.errors
from nats.js.kv import KeyValue
from pydantic import BaseModel

from contracts.api.webhook import WebhookDelivery, WebhookEndpoint
from services.runtime.nats.kv import (
    Bucket,
    erase,
    latest_entries,
    read_entry,
    read_last,
    read_latest,
    read_page,
    read_value,
    replicated,
)

ENDPOINT = "endpoint"
DELIVERY = "delivery"
DUE = "due"
Stored = TypeVar("Stored", bound=BaseModel)


PRUNE_PAGE = 500
"""Deliveries a prune reads (and holds) at once."""
PRUNE_PAGE_BYTES = 4 << 20


class _AttemptTime(BaseModel):
    attempted_at: float


class _Prunable(BaseModel):
    """What a prune reads of a delivery (the rest of it is skipped while decoding)."""

    id: str
    status: str
    created_at: float
    attempts: list[_AttemptTime] = []


class Due(BaseModel):
    endpoint_id: str
    not_before: float
    """Seconds since the epoch: when the next attempt may start (a claim moves it on by its lease)."""


@dataclass(frozen=True)
class Claim:
    delivery_id: str
    endpoint_id: str


@dataclass
class WebhookStore:
    kv: Bucket
    leases: dict[str, int] = field(default_factory=dict)
    """Delivery id → the revision of its due entry this gateway's claim wrote, while its attempt runs."""

    async def put_endpoint(self, endpoint: WebhookEndpoint) -> None:
        await self.kv.put(f"{ENDPOINT}.{endpoint.id}", endpoint.model_dump_json().encode())

    async def get_endpoint(self, endpoint_id: str) -> WebhookEndpoint | None:
        return await self._get(f"{ENDPOINT}.{endpoint_id}", WebhookEndpoint)

    async def list_endpoints(self) -> list[WebhookEndpoint]:
        entries = await latest_entries(self.kv, f"{ENDPOINT}.*")
        found = [WebhookEndpoint.model_validate_json(value) for _, value in entries]
        return sorted(found, key=lambda endpoint: (endpoint.created_at, endpoint.id))

    async def get_endpoints(self, endpoint_ids: list[str]) -> list[WebhookEndpoint]:
        """The endpoints of `endpoint_ids` that exist, in the order `list_endpoints` gives, as written last: on a
        replicated bucket each is asked of the leader (a lagging replica may hold one a revision behind, or not yet)."""
        keys = [f"{ENDPOINT}.{endpoint_id}" for endpoint_id in endpoint_ids]
        values = {} if await replicated(self.kv.js, self.kv.stream) else await read_last(self.kv, keys)
        for key in keys:
            if key not in values and (value := await read_value(self.kv, key)) is not None:
                values[key] = value
        found = [WebhookEndpoint.model_validate_json(value) for value in values.values()]
        return sorted(found, key=lambda endpoint: (endpoint.created_at, endpoint.id))

    async def change_endpoint(self, endpoint_id: str,
                              change: Callable[[WebhookEndpoint], WebhookEndpoint]) -> WebhookEndpoint | None:
        """The endpoint as `change` makes it of what is stored now; None once it is deleted (a change never brings
        it back)."""
        return await self._change(f"{ENDPOINT}.{endpoint_id}", WebhookEndpoint, change)

    async def change_delivery(self, endpoint_id: str, delivery_id: str,
                              change: Callable[[WebhookDelivery], WebhookDelivery | None]) -> WebhookDelivery | None:
        """The delivery as `change` makes it of what is stored now (`change` answering None: left as it is); None
        when there is none. An attempt recorded meanwhile, or a redelivery asked at the same time, is read and
        changed again, never overwritten."""
        return await self._change(self._delivery_key(endpoint_id, delivery_id), WebhookDelivery, change)

    async def _change(self, key: str, model: type[Stored], change: Callable[[Stored], Stored | None]) -> Stored | None:
        """Compare-and-set: `change` applied to what is stored now, written only over that revision."""
        while True:
            entry = await read_entry(self.kv, key)
            if entry is None or entry.value is None:
                return None
            current = model.model_validate_json(entry.value)
            changed = change(current)
            if changed is None:
                return current
            try:
                await self.kv.update(key, changed.model_dump_json().encode(), last=entry.revision)
            except nats.js.errors.KeyWrongLastSequenceError:
                continue
            return changed

    async def delete_endpoint(self, endpoint_id: str) -> None:
        """The endpoint goes; its deliveries stay readable, and those still due end `failed` when next taken."""
        await self.kv.purge(f"{ENDPOINT}.{endpoint_id}")

    async def add_delivery(self, delivery: WebhookDelivery) -> None:
        """Record a delivery and make it due, once: taken again (a fact redelivered), a delivery already recorded
        is left as it is, and made due again only while it is still pending (a crash between the two writes)."""
        try:
            await self.kv.create(self._delivery_key(delivery.endpoint_id, delivery.id),
                                 delivery.model_dump_json().encode())
        except nats.js.errors.KeyWrongLastSequenceError:
            recorded = await self.get_delivery(delivery.endpoint_id, delivery.id)
            if recorded is None or recorded.status != "pending":
                return
        await self._make_due(delivery)

    async def _make_due(self, delivery: WebhookDelivery) -> None:
        """A due entry for the delivery at its next attempt, unless it has one."""
        due = Due(endpoint_id=delivery.endpoint_id, not_before=delivery.next_attempt_at or time.time())
        with contextlib.suppress(nats.js.errors.KeyWrongLastSequenceError):  # due already
            await self.kv.create(f"{DUE}.{delivery.id}", due.model_dump_json().encode())

    async def get_delivery(self, endpoint_id: str, delivery_id: str) -> WebhookDelivery | None:
        return await self._get(self._delivery_key(endpoint_id, delivery_id), WebhookDelivery)

    async def _get(self, key: str, model: type[Stored]) -> Stored | None:
        raw = await read_latest(self.kv, key)
        return None if raw is None else model.model_validate_json(raw)

    async def list_deliveries(self, endpoint_id: str) -> list[WebhookDelivery]:
        """The endpoint's deliveries, newest first."""
        found = [WebhookDelivery.model_validate_json(value)
                 for _, value in await latest_entries(self.kv, f"{DELIVERY}.{endpoint_id}.*")]
        return sorted(found, key=lambda delivery: (delivery.created_at, delivery.id), reverse=True)

    async def claim(self, claim: Claim, lease_s: float, now: float) -> bool | None:
        """Take a due delivery for `lease_s`; False: another gateway took it (or it is no longer due); None: it has
        no due entry any more (it ended)."""
        key = f"{DUE}.{claim.delivery_id}"
        try:
            entry: KeyValue.Entry | None = await self.kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            entry = None
        if entry is None or not entry.value:  # a replica lagging may not hold it yet: gone only if the leader says so
            entry = await read_entry(self.kv, key)
            if entry is None or not entry.value:
                return None
        if Due.model_validate_json(entry.value).not_before > now:
            return False
        leased = Due(endpoint_id=claim.endpoint_id, not_before=now + lease_s)
        try:
            self.leases[claim.delivery_id] = await self.kv.update(key, leased.model_dump_json().encode(),
                                                                  last=entry.revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            return False
        return True

    async def reschedule(self, claim: Claim, at: float, lease: int | None = None) -> None:
        """Make the claimed delivery due at `at`, only while this claim's lease is the entry's last write: one whose
        attempt outlived its lease leaves another claim as it is, this gateway's own included. `lease`: the revision
        the attempt's own claim wrote (`lease_of` right after it; by default the delivery's latest claim here)."""
        leased = self.leases.get(claim.delivery_id) if lease is None else lease
        self.forget(claim, leased)
        if leased is None:
            return
        with contextlib.suppress(nats.js.errors.KeyWrongLastSequenceError):
            await self.kv.update(f"{DUE}.{claim.delivery_id}",
                                 Due(endpoint_id=claim.endpoint_id, not_before=at).model_dump_json().encode(),
                                 last=leased)

    def lease_of(self, claim: Claim) -> int | None:
        """The revision this gateway's latest claim of the delivery wrote."""
        return self.leases.get(claim.delivery_id)

    def forget(self, claim: Claim, lease: int | None = None) -> None:
        """The claim's attempt is over: its lease is forgotten (not a later claim's of the same delivery)."""
        if lease is None or self.leases.get(claim.delivery_id) == lease:
            self.leases.pop(claim.delivery_id, None)

    async def finish(self, claim: Claim) -> None:
        """The delivery needs no more attempts (delivered, or given up): its due entry is erased (a purge would
        leave a marker per delivery for ever, which every poll reads)."""
        await erase(self.kv, f"{DUE}.{claim.delivery_id}")

    async def due_if_pending(self, claim: Claim) -> None:
        """After `finish`: the delivery made due again if it is pending now. A redelivery asked while the attempt
        ended found the due entry still there, so it made none, and `finish` then erased it."""
        delivery = await self.get_delivery(claim.endpoint_id, claim.delivery_id)
        if delivery is not None and delivery.status == "pending":
            await self._make_due(delivery)

    async def prune(self, ended_before: float) -> int:
        """Erase the deliveries that ended before `ended_before` (never a pending one); how many. Deliveries are read
        a page at a time, and only what decides is decoded: never every tenant's deliveries held at once."""
        erased, after = 0, 0
        while True:
            page, more = await read_page(self.kv.js, self.kv.stream, f"{self.kv.prefix}{DELIVERY}.*.*", after,
                                         PRUNE_PAGE, PRUNE_PAGE_BYTES)
            for message in page:
                if not message.value:
                    continue
                seen = _Prunable.model_validate_json(message.data)
                ended_at = seen.attempts[-1].attempted_at if seen.attempts else seen.created_at
                if seen.status != "pending" and ended_at < ended_before:
                    key = message.subject[len(self.kv.prefix):]
                    # Only the revision read: one a redelivery made pending meanwhile stays, and is due again.
                    await erase(self.kv, key, through=message.seq)
                    await erase(self.kv, f"{DUE}.{seen.id}")  # a marker an older version's purge left
                    await self.due_if_pending(Claim(seen.id, key.split(".")[1]))
                    erased += 1
            if not page or not more:
                return erased
            after = page[-1].seq

    @staticmethod
    def _delivery_key(endpoint_id: str, delivery_id: str) -> str:
        return f"{DELIVERY}.{endpoint_id}.{delivery_id}"
