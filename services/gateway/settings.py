"""Gateway settings (`SHESHNAG_GATEWAY_*`)."""

from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from services.gateway.webhooks.targets import parse_networks
from services.runtime.process.settings import ServiceSettings


class GatewaySettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="SHESHNAG_GATEWAY_", extra="ignore")

    host: str = "127.0.0.1"
    """The address the API listens on (`sheshnag up --listen` sets it)."""
    port: int = 8080
    """The API's port."""
    tls_cert: Path | None = None
    """Serve HTTPS with this certificate (PEM, leaf first, then any intermediates); `sheshnag up --listen` sets the
    stack's own, signed by the data dir's CA. Set your own (an ACME or company CA's) with `tls_key`; both are read
    again on SIGHUP. Unset: plain HTTP (loopback, or behind a load balancer that terminates TLS)."""
    tls_key: Path | None = None
    """The private key of `tls_cert` (PEM, unencrypted, readable by the gateway alone)."""
    provider_nats_url: str = ""
    """The broker URL(s), comma-separated and without credentials, that `GET /v1/provider/connection` tells
    provider hosts to connect to; empty: `SHESHNAG_NATS_URL` less its credentials."""
    billing: bool = False
    """Bill batches: each create reserves its worst-case price from the owner's organisation's credit (402
    `insufficient_balance` without it), usage is debited as it commits, the rest refunded at the end. Off: no
    balances needed (the embedded default)."""
    credit_sweep_interval_s: float = 5.0
    """With billing on, how often batches of organisations whose balance fell below zero are stopped
    (`insufficient_credits`); 0 turns it off."""
    max_upload_bytes: int = 100 * 1024 * 1024
    """The largest file an upload may be (413 `file_too_large` past it)."""
    min_completion_window_s: int = 24 * 3600
    """The shortest completion_window accepted (OpenAI's 24h); lowered only to test expiry."""
    read_your_writes_s: float = 5.0
    """How long a create waits for the ledger to show what it just published."""
    own_writes_wait_s: float = 10.0
    """How long a list waits for the ledger to show the owner's creates and deletes that this gateway answered
    before the ledger showed them (read-your-writes for lists)."""
    storage_quota_bytes: int = 10 * 1024 * 1024 * 1024
    """Bytes of files one owner (a user, or a key without one) may keep stored; output files count but are never
    refused."""
    batch_file_ttl_s: int = 30 * 24 * 3600
    """How long an uploaded batch file lives unless the upload's `expires_after` says otherwise."""
    metrics_refresh_s: float = 15.0
    """How often the fleet-wide gauges of `/metrics` (batches per status, the queue, consumer lag, executors) are
    set from the batch census (kept as batch records change; a refresh reads only unfinished batches, never ended
    ones); a scrape only reads the last figures. 0: never (those gauges stay empty; the census is kept for quotes)."""
    file_sweep_interval_s: float = 60.0
    """How often expired files are deleted; 0 turns the sweeper off."""
    orphan_sweep_interval_s: float = 86400.0
    """How often the object store's file objects are listed and those the log holds no file for (never stated, or
    deleted while their removal failed), older than the longest completion window and a day, removed; 0: never."""
    max_active_batches: int = 100
    """Batches one owner (a user, or a key without one) may have that have not ended yet."""
    max_keys_per_user: int = 100
    """Keys one user may have that are not revoked (429 `too_many_keys` past it), however they are created."""
    max_providers_per_user: int = 20
    """Providers one user (or a key of no user) may register (429 `too_many_providers` past it, however many gateways
    are asked at once): each is kept in the log and the read model for good."""
    max_worker_keys_per_provider: int = 100
    """Worker keys one provider may have that are not revoked (429 `too_many_keys` past it): one per executor host."""
    max_webhooks_per_owner: int = 20
    """Webhook endpoints one owner (a user; an organisation, for its organisation-wide ones) may register (400
    `too_many_webhooks` past it, however many gateways are asked at once)."""
    control_calls_per_s: float = 10.0
    """Sustained rate of control calls (create, cancel, delete; also a tenant's creates of its own keys and worker
    keys, never an admin's, and never a revocation) per owner (a user, all their keys together, or a key of no
    user); reads and lines never count."""
    control_call_burst: int = 50
    """Control calls an owner may make at once before the sustained rate applies."""
    auth_failure_limit: int = 100
    """Unknown keys one client address may present within `auth_failure_window_s`; past it, 429
    `too_many_failed_authentications` for its guesses (never for a right generated key; see auth_failures.py)
    until the window passes. 0 turns the limit off."""
    auth_failure_window_s: float = 60.0
    """The window `auth_failure_limit` counts unknown keys in."""
    refusal_pace_budget: int = 1000
    """Refusals (401, 403, 429) one client address gets answered at once within `refusal_pace_window_s`; past it,
    each is answered `refusal_pace_delay_s` late, so a client looping on refused requests cannot take the gateway's
    time from other tenants. 0: never delayed."""
    refusal_pace_window_s: float = 10.0
    """The window `refusal_pace_budget` counts refusals in."""
    refusal_pace_delay_s: float = 0.25
    """How late each refusal past the budget is answered (a client looping on them makes four a second)."""
    upload_slots: int = Field(default=16, ge=1)
    """Uploads one gateway streams to the object store at once; more wait for a slot, served owner by owner in
    turn (an owner's waiting uploads never go before another owner's)."""
    upload_slots_per_owner: int = Field(default=4, ge=1)
    """Upload slots one owner (a user, all their keys together, or a key of no user) may hold at once on one
    gateway; their further uploads wait in their own line, so one client's stalled or slow uploads never hold the
    slots others need."""
    uploads_per_address: int = Field(default=64, ge=0)
    """Uploads one client address may have in flight at once on one gateway (holding a slot or waiting for one),
    counted before authentication, so uploads with no key or a wrong one count too; past it, 429
    `too_many_uploads`. 0: no cap (a gateway behind a proxy that hides client addresses)."""
    upload_min_bytes_per_s: float = Field(default=4096.0, ge=0)
    """The slowest an upload's body may arrive once it holds a slot: one that brings fewer than this many bytes a
    second over a whole `upload_min_rate_window_s` of the gateway waiting for it is cut with 408
    `request_timeout`, freeing its slot (time the object store takes is not counted). 0: no minimum (only
    `client_idle_timeout_s` applies)."""
    upload_min_rate_window_s: float = Field(default=10.0, gt=0)
    """The window `upload_min_bytes_per_s` is measured over: an upload holding a slot is cut within about this long
    once it stalls or trickles."""
    download_slots: int = Field(default=64, ge=1)
    """File downloads one gateway streams at once; more wait for a slot, served owner by owner in turn."""
    download_slots_per_owner: int = Field(default=16, ge=1)
    """Download slots one owner may hold at once on one gateway; their further downloads wait in their own line."""
    event_streams_per_owner: int = Field(default=256, ge=1)
    """Event streams (`/v1/batches/{id}/events`) one owner may hold open at once on one gateway; more get 429."""
    transfer_slot_wait_s: float = 30.0
    """How long an upload or download waits for a slot before it gets 503 `server_busy` with Retry-After."""
    client_idle_timeout_s: float = 30.0
    """How long an upload may send nothing (or a download take nothing) before it ends with 408; an event stream whose
    client takes nothing for this long is closed."""
    object_store_timeout_s: float = 120.0
    """How long one part of an upload may take the object store before the upload ends with 503."""
    webhooks: bool = True
    """Deliver webhooks: every gateway takes the batch facts webhooks are registered for and sends them (one durable
    consumer shared by all, so each fact is taken by one)."""
    webhook_timeout_s: float = 15.0
    """How long one delivery attempt may take (connect to the end of the answer) before it counts as failed."""
    webhook_retry_delays_s: list[float] = [5, 300, 1800, 7200, 18000, 36000, 36000, 36000, 36000, 36000, 36000]
    """The wait before each retry of a failed delivery (Standard Webhooks' schedule, stretched to about 70 hours as
    OpenAI's); one attempt more than there are delays, then the delivery is `failed`."""
    webhook_poll_interval_s: float = Field(default=1.0, gt=0)
    """How often a gateway looks for deliveries that are due; more than 0 (`webhooks` false turns delivery off)."""
    webhook_concurrency: int = 16
    """Delivery attempts one gateway makes at once, shared fairly: due deliveries are taken round-robin across
    owners, within the two limits below."""
    webhook_owner_concurrency: int = 4
    """Delivery attempts one gateway makes at once to the endpoints of one owner (the user or key that registered
    them): one owner's slow or dead endpoints never hold every slot."""
    webhook_endpoint_concurrency: int = 2
    """Delivery attempts one gateway makes at once to one endpoint."""
    webhook_connect_timeout_s: float = 5.0
    """How long connecting to an endpoint may take (within `webhook_timeout_s`)."""
    webhook_breaker_failures: int = 5
    """Consecutive failed attempts to one endpoint after which a gateway stops trying it (its due deliveries wait,
    not attempted) for `webhook_breaker_cooldown_s`; then one attempt probes it: a success closes the breaker, a
    failure opens it again."""
    webhook_breaker_cooldown_s: float = 60.0
    """How long an endpoint's open breaker defers its deliveries before a probe."""
    webhook_allowed_cidrs: Annotated[list[str], NoDecode] = []
    """Addresses webhooks may go to besides public ones, comma-separated CIDRs (`127.0.0.0/8,::1/128`). By default
    none: an endpoint resolving only to a loopback, private, link-local, unique-local, multicast or metadata address
    is refused at registration, and a delivery whose host resolves to one then fails without connecting.
    `sheshnag up --webhooks-to-loopback` allows loopback."""
    webhook_nameservers: Annotated[list[str], NoDecode] = []
    """Name servers webhook hosts are resolved with, comma-separated `IP` or `IP:port` (by default the system's, from
    resolv.conf). Point them at a public resolver to keep tenants' host names off the operator's own DNS."""
    webhook_retention_days: float = 30.0
    """How long a delivery that has ended (delivered, or failed for good) stays listed with its attempts; then it is
    erased. 0: kept for ever."""
    webhook_require_https: bool = False
    """Refuse endpoint URLs that are not `https://` (OpenAI's rule); off, `http://` is allowed too (local
    receivers)."""

    @field_validator("webhook_nameservers", mode="before")
    @classmethod
    def _nameserver_list(cls, value: object) -> object:
        servers = value.split(",") if isinstance(value, str) else value
        return [str(server).strip() for server in servers if str(server).strip()] if isinstance(servers, list) \
            else servers

    @field_validator("webhook_allowed_cidrs", mode="before")
    @classmethod
    def _cidr_list(cls, value: object) -> object:
        cidrs = value.split(",") if isinstance(value, str) else value
        if isinstance(cidrs, list):
            parse_networks([str(cidr) for cidr in cidrs])  # a bad one is refused at start, by name
            return [str(cidr).strip() for cidr in cidrs if str(cidr).strip()]
        return value

    @model_validator(mode="after")
    def _tls_pair(self) -> "GatewaySettings":
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("SHESHNAG_GATEWAY_TLS_CERT and SHESHNAG_GATEWAY_TLS_KEY go together: set both or neither")
        return self
