"""Taking one batch fact from the log: the deliveries it makes, one per endpoint that receives it, recorded and made
due in the webhooks bucket. Taking the same fact again records nothing new (ids are derived from the fact)."""

import logging
import time

import orjson

from contracts.api.webhook import WebhookDelivery
from contracts.subjects import parse_event_subject
from services.gateway.usecases.oversight import organization_of, owning_user
from services.gateway.webhooks.domain import delivery_id, event_type_of, receives, webhook_event
from services.gateway.webhooks.store import WebhookStore
from services.runtime.nats.readmodel import ReadModel

log = logging.getLogger(__name__)


class BatchNotYetKnown(Exception):
    """The read model does not show the fact's batch yet (the ledger is behind): take the fact again later."""


async def take_fact(store: WebhookStore, read_model: ReadModel, subject: str, sequence: int, data: bytes) -> int:
    """Record the deliveries of the fact at `sequence`; how many endpoints receive it."""
    fact = parse_event_subject(subject)
    event_type = event_type_of(fact.name) if fact is not None and fact.kind == "batch" else None
    if fact is None or event_type is None:
        return 0
    payload = orjson.loads(data)
    occurred_at = int(payload.get("occurred_at") or time.time() * 1000)
    candidates = [endpoint for endpoint in await store.list_endpoints()
                  if endpoint.enabled and event_type in endpoint.events]
    if not candidates:
        return 0
    record = await read_model.get_batch(fact.aggregate_id)
    if record is None:
        raise BatchNotYetKnown(fact.aggregate_id)
    member = await owning_user(read_model, record.owner)
    organization = organization_of(member) if member is not None else None
    event = webhook_event(str(payload.get("event_id") or f"{fact.aggregate_id}:{fact.name}"), event_type,
                          fact.aggregate_id, occurred_at)
    receivers = [endpoint for endpoint in candidates
                 if receives(endpoint, event_type, record.owner, organization, occurred_at)]
    now = time.time()
    for endpoint in receivers:
        await store.add_delivery(WebhookDelivery(
            id=delivery_id(endpoint.id, event.id), endpoint_id=endpoint.id, event=event, status="pending",
            next_attempt_at=now, created_at=now, event_sequence=sequence))
    if receivers:
        log.info("%s of %s: %d webhook deliveries", event_type, fact.aggregate_id, len(receivers))
    return len(receivers)
