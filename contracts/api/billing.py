"""What `/v1/billing/…` and `POST /v1/batches/quote` answer, and the bodies they take. Money is a decimal string of
USD (six places: micro-USD) so no client rounds it."""

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from contracts.api.batch import Endpoint
from contracts.api.field_errors import refused_as
from contracts.api.organization import ChosenId


class BalanceMovement(BaseModel):
    type: Literal["grant", "reservation", "debit", "refund", "release"]
    amount_usd: str
    endpoint: str | None = None
    """For a batch's movements: its endpoint marked `:batch` (e.g. `/v1/chat/completions:batch`)."""
    batch_id: str | None = None
    created_at: int


class BillingBalance(BaseModel):
    object: Literal["billing.balance"] = "billing.balance"
    organization_id: str
    currency: Literal["usd"] = "usd"
    billing_enabled: bool
    """False: this deployment does not bill (the embedded default); batches need no credit."""
    balance_usd: str
    """Granted less debited."""
    reserved_usd: str
    """Held for batches that have not ended, less what they were debited already."""
    available_usd: str
    """What a new batch may reserve: the balance less the reservations."""
    granted_usd: str
    debited_usd: str
    open_batches: int
    last_event: BalanceMovement | None = None


class GrantCredits(BaseModel):
    """`POST /v1/billing/grants` (an admin key): credit an organisation (a negative amount takes credit back)."""

    model_config = ConfigDict(extra="forbid")

    organization_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"), refused_as(
        "invalid_id", "organization_id is 1-64 letters, digits, '_' or '-' (got {given}).")]
    amount_usd: Annotated[str, Field(pattern=r"^-?[0-9]{1,12}(\.[0-9]{1,6})?$",
                                     json_schema_extra={"not": {"pattern": r"^-?0+(\.0+)?$"}}), refused_as(
        "invalid_amount", "amount_usd is a decimal string of USD with at most six decimals, e.g. \"25\" or \"0.50\" "
        "(got {given}).")]
    note: str = Field(default="", max_length=512)
    grant_id: ChosenId = None
    """Makes a retried grant a no-op, however much later (another amount or note under it: 409); omitted: each call
    grants anew."""


class Grant(BaseModel):
    object: Literal["billing.grant"] = "billing.grant"
    id: str
    organization_id: str
    amount_usd: str
    note: str


class QuoteRequest(BaseModel):
    """`POST /v1/batches/quote`: what a batch on this file would cost, without reserving anything."""

    model_config = ConfigDict(extra="forbid")

    input_file_id: Annotated[str, Field(min_length=1), refused_as(
        "missing_required_parameter", "input_file_id is required: upload a file with purpose 'batch' first.")]
    endpoint: Endpoint | None = None
    """Omitted: the model's first endpoint."""
    metadata: dict[str, str] | None = None
    """As the create would send it: `model` names the model of lines without one, `max_price_usd` is checked."""


class QuotePrice(BaseModel):
    min_usd: str
    """Every prompt token cached and no output token (at least the batch minimum)."""
    estimate_usd: str
    """Every output limit half used (Reliquary's estimate)."""
    max_usd: str
    """The worst case: what a create reserves."""


class QueueEstimate(BaseModel):
    lines_ahead: int
    """Lines of the model's unfinished batches still to run, across every owner."""
    lines_per_s: float | None
    """The fleet's rate for the model over the last hour; None: it did not run in that hour."""
    eta_s: int | None
    """When a batch created now should be done, at that rate; None without a rate."""


class BatchQuote(BaseModel):
    object: Literal["batch.quote"] = "batch.quote"
    input_file_id: str
    model: str
    endpoint: str
    billing_enabled: bool
    lines: int
    """Lines that parse as requests (the validator may still refuse some: they cost nothing)."""
    input_tokens_max: int
    """Prompt tokens at most: a byte-level tokenizer makes at most one token of each byte, plus the template's."""
    output_tokens_max: int
    """Every sample at its `max_tokens` (lines without one: at the model's context)."""
    price: QuotePrice
    available_usd: str | None
    """The caller's organisation's available credit (None with billing off)."""
    fits_balance: bool
    """Whether a create now would be refused with `insufficient_balance`."""
    queue: QueueEstimate
