"""The webhook intake, the gateways' one consumer declaration (`webhook_router`): each batch fact a webhook is sent
for, taken by one gateway, becomes its deliveries, one per endpoint that receives it, recorded and made due in the
webhooks bucket before the fact is acked. Taking the same fact again records nothing new (ids are derived from it)."""

import logging
import time
from dataclasses import dataclass
from typing import Annotated, Any, Union

from pydantic import Field

from contracts.api.webhook import WebhookDelivery
from contracts.events.envelope import Event
from contracts.subjects import EVENTS_STREAM, WEBHOOKS_DURABLE
from services.gateway.usecases.oversight import organization_of, owning_user
from services.gateway.webhooks.directory import EndpointDirectory
from services.gateway.webhooks.domain import SENT_FACTS, delivery_id, webhook_event
from services.gateway.webhooks.store import WebhookStore
from services.runtime.nats.bus import ConsumerPolicy, NotYet
from services.runtime.nats.delivery import Durable, ServiceRouter, fact_filter
from services.runtime.nats.readmodel import ReadModel

log = logging.getLogger(__name__)

SentFact: Any = Annotated[Union[tuple(SENT_FACTS)], Field(discriminator="type")]  # noqa: UP007 (built from a table)
"""Any fact a webhook is sent for."""
INTAKE = Durable(SentFact, EVENTS_STREAM, WEBHOOKS_DURABLE, "",
                 ConsumerPolicy(ack_wait_s=60.0, max_deliver=-1, max_ack_pending=256),
                 filter_subjects=tuple(sorted({fact_filter(contract) for contract in SENT_FACTS})))
"""One consumer for every fact type, shared by every gateway: its name and filters are those it always had, so a
gateway upgraded keeps its ack floor. A fact is never given up on (that would lose a delivery): one whose batch the
read model does not show yet is taken again, with the router's backoff."""
WEBHOOKS = "webhooks"
"""The name of the intake (`WebhookIntake`) in the broker's context."""


class BatchNotYetKnown(NotYet):
    """The read model does not show the fact's batch yet (the ledger is behind): take the fact again later."""


@dataclass(frozen=True)
class WebhookIntake:
    """What the intake records deliveries in, looks endpoints up in, and reads each fact's batch from."""

    store: WebhookStore
    directory: EndpointDirectory
    read_model: ReadModel

    async def take(self, fact: Event, sequence: int) -> None:
        """Record the deliveries of `fact`, at `sequence` in the log: to its batch owner's and organisation's
        endpoints only (looked up, never every tenant's listed)."""
        event_type = SENT_FACTS[type(fact)]
        endpoints = await self.directory.current_endpoints(self.store.kv)
        if not endpoints.wanted.get(event_type):
            return
        record = await self.read_model.get_batch(fact.aggregate_id)
        if record is None:
            raise BatchNotYetKnown(fact.aggregate_id)
        member = await owning_user(self.read_model, record.owner)
        organization = organization_of(member) if member is not None else None
        event = webhook_event(fact.event_id, event_type, fact.aggregate_id, fact.occurred_at)
        receivers = endpoints.receivers(event_type, record.owner, organization, fact.occurred_at)
        now = time.time()
        for endpoint in receivers:
            await self.store.add_delivery(WebhookDelivery(
                id=delivery_id(endpoint.id, event.id), endpoint_id=endpoint.id, event=event, status="pending",
                next_attempt_at=now, created_at=now, event_sequence=sequence))
        if receivers:
            log.info("%s of %s: %d webhook deliveries", event_type, fact.aggregate_id, len(receivers))


def webhook_router() -> ServiceRouter:
    """The gateway's table: the intake, on the `WebhookIntake` named `WEBHOOKS` in the broker's context."""
    router = ServiceRouter("gateway", dependencies=WEBHOOKS)
    router.durable(INTAKE, WebhookIntake.take, None, "Record the webhook deliveries of a batch fact.")
    return router
