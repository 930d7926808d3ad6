"""Webhooks as `/v1/webhooks/…` show them: endpoints a user or an organisation registers, the events sent to them
(OpenAI's `batch.completed`, `batch.failed`, `batch.expired`, `batch.cancelled`, and Sheshnag's `batch.validated`),
and every delivery with its attempts. Payloads are OpenAI's webhook event object, signed per Standard Webhooks."""

from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, Strict

WebhookEventType = Literal["batch.completed", "batch.failed", "batch.expired", "batch.cancelled", "batch.validated"]
WEBHOOK_EVENT_TYPES: tuple[WebhookEventType, ...] = get_args(WebhookEventType)
WebhookScope = Literal["user", "organization"]
"""`user`: the batches of the user (or key) that registered it; `organization`: every batch of its organisation's
members (registered by an administrator of it, or an admin key)."""
DeliveryStatus = Literal["pending", "delivered", "failed"]

MAX_URL_LENGTH = 2048
WebhookUrl = Annotated[str, Field(min_length=8, max_length=MAX_URL_LENGTH)]


class CreateWebhook(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: WebhookUrl
    """Where events are POSTed: an `https://` URL (`http://` where the deployment allows it)."""
    events: list[WebhookEventType] | None = Field(default=None, min_length=1, max_length=len(WEBHOOK_EVENT_TYPES))
    """The event types sent; omitted: every one."""
    scope: WebhookScope = "user"
    organization_id: str | None = Field(default=None, max_length=64)
    """For `scope=organization` by an admin key: the organisation (default: the caller's)."""
    description: str = Field(default="", max_length=512)


class UpdateWebhook(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: WebhookUrl | None = None
    events: list[WebhookEventType] | None = Field(default=None, min_length=1, max_length=len(WEBHOOK_EVENT_TYPES))
    enabled: Annotated[bool, Strict()] | None = None
    """true or false (JSON booleans only: `0`, `"off"` are refused)."""
    description: str | None = Field(default=None, max_length=512)


class WebhookEndpoint(BaseModel):
    id: str
    object: Literal["webhook_endpoint"] = "webhook_endpoint"
    url: str
    events: list[WebhookEventType]
    scope: WebhookScope
    owner: str
    """The user (`user-…`) or key (`key-…`) that registered it."""
    organization_id: str
    enabled: bool
    description: str
    created_at: int
    secret: str | None = None
    """`whsec_…`: the signing secret (Standard Webhooks); in the create and rotate answers only."""


class DeletedWebhook(BaseModel):
    id: str
    object: Literal["webhook_endpoint.deleted"] = "webhook_endpoint.deleted"
    deleted: Literal[True] = True


class WebhookEventData(BaseModel):
    id: str
    """The batch's id."""


class WebhookEvent(BaseModel):
    """The body POSTed to an endpoint: OpenAI's webhook event object."""

    object: Literal["event"] = "event"
    id: str
    """`evt_…`: one per fact, whatever endpoint it goes to."""
    type: WebhookEventType
    created_at: int
    """When the fact happened (seconds since the epoch)."""
    data: WebhookEventData


class DeliveryAttempt(BaseModel):
    attempted_at: float
    status_code: int | None
    """The endpoint's HTTP status; None when no answer came (`error` says why)."""
    error: str | None = None
    duration_ms: int


class WebhookDelivery(BaseModel):
    id: str
    """`msg_…`: the `webhook-id` header, the same on every attempt (receivers deduplicate on it)."""
    object: Literal["webhook_delivery"] = "webhook_delivery"
    endpoint_id: str
    event: WebhookEvent
    status: DeliveryStatus
    attempts: list[DeliveryAttempt] = Field(default_factory=list)
    next_attempt_at: float | None = None
    """When the next attempt is due (pending deliveries)."""
    created_at: float
    event_sequence: int
    """The fact's sequence in the event log."""
