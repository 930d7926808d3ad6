"""What a webhook delivery is, without I/O: which facts become which event types, who receives them, the ids a
fact and a delivery get (derived, so a fact taken twice or a gateway restarted names them the same), and when a
failed delivery is tried again."""

from contracts.api.webhook import WebhookEndpoint, WebhookEvent, WebhookEventData, WebhookEventType
from contracts.events.batch import (
    BatchCancelled,
    BatchCompleted,
    BatchExpired,
    BatchFailed,
    BatchValidated,
    BatchValidationFailed,
)
from contracts.events.envelope import Event
from contracts.ids import derived_id

SENT_FACTS: dict[type[Event], WebhookEventType] = {
    BatchCompleted: "batch.completed",
    BatchFailed: "batch.failed",
    BatchValidationFailed: "batch.failed",
    BatchExpired: "batch.expired",
    BatchCancelled: "batch.cancelled",
    BatchValidated: "batch.validated",
}
"""Every batch fact a webhook is sent for, and its event type (a refused validation is OpenAI's `batch.failed`)."""


def webhook_event(fact_event_id: str, event_type: WebhookEventType, batch_id: str, occurred_at_ms: int) -> WebhookEvent:
    """The body sent for one fact: the same `evt_…` id to every endpoint and on every attempt."""
    return WebhookEvent(id=derived_id("evt_", fact_event_id), type=event_type, created_at=occurred_at_ms // 1000,
                        data=WebhookEventData(id=batch_id))


def delivery_id(endpoint_id: str, event_id: str) -> str:
    """The `webhook-id` of one event to one endpoint, the same on every attempt and after any restart."""
    return derived_id("msg_", endpoint_id, event_id)


def receives(endpoint: WebhookEndpoint, event_type: WebhookEventType, batch_owner: str,
             batch_organization: str | None, occurred_at_ms: int) -> bool:
    """Whether `endpoint` is sent this event of a batch owned by `batch_owner` (of `batch_organization`): only facts
    from its registration on, so a deliverer catching up never sends it the history before it existed."""
    if not endpoint.enabled or event_type not in endpoint.events or occurred_at_ms < endpoint.created_at * 1000:
        return False
    if endpoint.scope == "user":
        return endpoint.owner == batch_owner
    return batch_organization is not None and endpoint.organization_id == batch_organization


def is_success(status_code: int) -> bool:
    """Standard Webhooks: any 2xx acknowledges a delivery; anything else (a redirect too) is retried."""
    return 200 <= status_code < 300


def retry_delay(attempts_made: int, delays_s: list[float]) -> float | None:
    """The wait before the next attempt after `attempts_made` failed ones; None: no attempt is left."""
    return delays_s[attempts_made - 1] if 1 <= attempts_made <= len(delays_s) else None
