"""Facts that move an organisation's credit: grants (and corrections), reservations made at batch creation, and
reservations released when their batch was never created. Debits and refunds are not stated: the ledger derives
them, exactly once, from the batch facts that carry usage (`batch.progressed`, and the batch's end)."""

from typing import ClassVar, Literal

from contracts.billing import ModelPrice
from contracts.events.envelope import Event


class AccountEvent(Event):
    kind: ClassVar = "account"


class CreditsGranted(AccountEvent):
    """Credit added to the account by an operator; a negative amount takes credit back (a correction)."""

    name: ClassVar = "granted"
    dedup_fields: ClassVar = ("grant_id",)
    type: Literal["account.granted"] = "account.granted"
    grant_id: str
    amount_micros: int
    """Micro-USD (1 USD = 1,000,000)."""
    note: str = ""
    granted_by: str = ""
    """Who granted it: the admin key's id, or `cli` for the operator CLI."""


class CreditsReserved(AccountEvent):
    """A batch's worst-case price, held from the account's available credit until the batch ends."""

    name: ClassVar = "reserved"
    dedup_fields: ClassVar = ("batch_id",)
    correlated_by: ClassVar = "batch_id"
    type: Literal["account.reserved"] = "account.reserved"
    batch_id: str
    amount_micros: int
    price: ModelPrice
    """The model's price when the batch was created: what its usage is charged at, whatever the catalogue says
    later (so a replay charges the same)."""
    model: str
    endpoint: str
    """The batch's endpoint: the balance's last movement shows it marked `…:batch` (InferNode's)."""


class CreditsReleased(AccountEvent):
    """A reservation whose batch was never created (its creation failed after the reservation) is given back."""

    name: ClassVar = "released"
    dedup_fields: ClassVar = ("batch_id",)
    correlated_by: ClassVar = "batch_id"
    type: Literal["account.released"] = "account.released"
    batch_id: str
    reason: str = ""
