"""Providers and the executors that joined with their worker keys, as `/v1/provider/…` shows them (a Sheshnag
extension; OpenAI has no such objects)."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from contracts.events.executor import EngineName


class RegisterProvider(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=256)


class ApproveProvider(BaseModel):
    """The body of `POST /v1/provider/providers/{id}/approve` (and `/unapprove`), optional."""

    model_config = ConfigDict(extra="forbid")

    organization_id: str | None = Field(default=None, max_length=64)
    """Approve for this organisation's batches only. Omitted: a platform admin approves for the whole platform, an
    organisation's administrator for their own organisation (the only one they may name)."""


class Provider(BaseModel):
    id: str
    """`prov_…`; worker keys made under `/v1/provider/providers/{id}/worker_keys` belong to it."""
    object: Literal["provider"] = "provider"
    name: str
    owner_user_id: str | None
    """The user whose keys manage it; null: only the key that registered it."""
    created_at: int
    organization_id: str
    """Its owner's organisation (`default`: the default one, and a provider registered by a key without a user):
    the one whose batches it serves even unapproved."""
    status: Literal["unapproved", "approved"]
    """`approved`: a platform admin approved it, so it serves every organisation's batches that allow approved
    providers; `unapproved`: only its own organisation's, and those of `approved_organizations`."""
    approved_organizations: list[str]
    """Organisations whose administrators approved it for their own batches."""


class ExecutorMemory(BaseModel):
    free_bytes: int
    total_bytes: int


class ProviderExecutor(BaseModel):
    id: str
    object: Literal["provider.executor"] = "provider.executor"
    provider_id: str | None
    """The provider whose worker key it joined with; null: an admin's or operator's worker key (or none)."""
    worker_key_id: str | None
    engine: EngineName
    engine_version: str
    models: list[str]
    """Catalogue ids it can serve."""
    loaded_models: list[str]
    """Catalogue ids loaded right now; empty while it is lost."""
    memory: ExecutorMemory | None
    """Summed over its devices, from its last heartbeat; null while it is lost."""
    slots: int | None
    health: Literal["live", "lost"]
    """`live` while it heartbeats; `lost` once its heartbeats stopped."""
    heartbeat_age_s: float | None
    """Seconds since its last heartbeat; null when none is known."""
    lines_served: int
    """Lines (completed or failed) that attempts it ran made durable."""



class ProviderConnection(BaseModel):
    """What a provider host needs, besides its worker key, to join: `GET /v1/provider/connection` (public: neither
    a broker's address nor its CA certificate is a secret; the broker admits by worker key alone)."""

    object: Literal["provider.connection"] = "provider.connection"
    nats_urls: list[str]
    """The broker's client URLs an executor connects to, as its executor id with its worker key; `tls://` where
    the broker requires TLS."""
    tls_ca_pem: str | None
    """PEM of the CA that signed the broker's certificate (the deployment's own); null: none is needed."""
    tls_ca_sha256: str | None
    """SHA-256 of that CA certificate (DER), hex: compare it with what `sheshnag up` printed to trust the answer."""
