"""An organisation's account in whole micro-USD: credit granted, batches' reservations (held until the batch ends), the
debits of their usage and the refunds. Each result chunk is debited once (by its key) and each fact once (by its
sequence), so a replay, a redelivery or a ledger killed mid-batch debits exactly what the live fold did."""

from decimal import Decimal
from typing import Any
from uuid import UUID

from eventsourcing.domain import event

from contracts.billing import ModelPrice
from services.ledger.folded import Folded, aggregate_id

Movement = dict[str, Any]
"""`{"type": grant|reservation|debit|refund|release, "amount_micros", "batch_id", "endpoint", "at", "sequence"}`."""


def batch_endpoint(endpoint: str) -> str:
    """How a batch's usage is marked among an account's movements (InferNode's `/v1/chat/completions:batch`)."""
    return f"{endpoint}:batch"


class Account(Folded):
    """One organisation's credit, folded from grants, reservations and its batches' usage."""

    @event("Opened")
    def __init__(self, account_id: str, sequence: int) -> None:
        self.account_id, self.last_sequence, self.anomalies = account_id, sequence, []
        self.balance_micros = self.granted_micros = self.debited_micros = 0
        self.open: dict[str, dict[str, Any]] = {}
        """Batch id → its reservation: `held`, `charged` (micro-USD), `price`, `usage` [input, cached, output],
        `chunks` (result chunk keys debited), `endpoint`, `model`."""
        self.last_event: Movement | None = None
        self.credit_sequence = 0
        """Stream sequence of the last grant, reservation or release: a reservation is fenced on it."""

    @classmethod
    def create_id(cls, account_id: str) -> UUID:
        return aggregate_id("account", account_id)

    @property
    def reserved_micros(self) -> int:
        return sum(max(entry["held"] - entry["charged"], 0) for entry in self.open.values())

    @property
    def available_micros(self) -> int:
        return self.balance_micros - self.reserved_micros

    def grant(self, sequence: int, amount_micros: int, at: int) -> None:
        if not self.has_folded(sequence):
            self._granted(sequence=sequence, amount_micros=amount_micros, at=at)

    @event("Granted")
    def _granted(self, sequence: int, amount_micros: int, at: int) -> None:
        self.last_sequence = self.credit_sequence = sequence
        self.balance_micros += amount_micros
        self.granted_micros += amount_micros
        self.last_event = _movement("grant", amount_micros, sequence, at)

    def reserve(self, sequence: int, batch_id: str, amount_micros: int, price: ModelPrice, model: str,
                endpoint: str, at: int) -> None:
        if self.has_folded(sequence):
            return
        if batch_id in self.open:
            self.note_anomaly(sequence, "reserved", f"batch {batch_id} already holds a reservation")
            return
        self._reserved(sequence=sequence, batch_id=batch_id, amount_micros=amount_micros,
                       price=price.model_dump(mode="json"), model=model, endpoint=endpoint, at=at)

    @event("Reserved")
    def _reserved(self, sequence: int, batch_id: str, amount_micros: int, price: dict[str, Any], model: str,
                  endpoint: str, at: int) -> None:
        self.last_sequence = self.credit_sequence = sequence
        self.open[batch_id] = {"held": amount_micros, "charged": 0, "price": price, "usage": [0, 0, 0],
                               "chunks": [], "endpoint": endpoint, "model": model}
        self.last_event = _movement("reservation", amount_micros, sequence, at, batch_id, batch_endpoint(endpoint))

    def release(self, sequence: int, batch_id: str, at: int) -> None:
        """A reservation whose batch was never created: given back whole."""
        if not self.has_folded(sequence) and batch_id in self.open:
            self._closed(sequence=sequence, batch_id=batch_id, extra_micros=0, at=at, credit=True)

    def saw_credit_fact(self, sequence: int) -> None:
        """A fact on the account's subject was folded, whatever it changed: the next reservation is fenced on it
        (a refused or repeated one moves the subject all the same)."""
        if self.credit_sequence < sequence:
            self._credit_fact_seen(sequence=sequence)

    @event("CreditFactSeen")
    def _credit_fact_seen(self, sequence: int) -> None:
        self.credit_sequence = max(self.credit_sequence, sequence)
        self.last_sequence = max(self.last_sequence, sequence)

    def debit(self, sequence: int, batch_id: str, chunk_key: str, usage: tuple[int, int, int], at: int) -> None:
        """A result chunk of the batch committed with this usage (input, cached, output tokens)."""
        entry = self.open.get(batch_id)
        if self.has_folded(sequence) or entry is None or chunk_key in entry["chunks"]:
            return
        total = [sum(pair) for pair in zip(entry["usage"], usage, strict=True)]
        amount = _price(entry).cost_micros(total[0], total[2], total[1]) - entry["charged"]
        # Never past the reservation: it holds the batch's worst case, so usage beyond it is usage no line can have.
        amount = min(amount, entry["held"] - entry["charged"])
        self._debited(sequence=sequence, batch_id=batch_id, chunk_key=chunk_key, usage=total,
                      amount_micros=max(amount, 0), at=at)

    @event("Debited")
    def _debited(self, sequence: int, batch_id: str, chunk_key: str, usage: list[int], amount_micros: int,
                 at: int) -> None:
        self.last_sequence = sequence
        entry = self.open[batch_id]
        entry["usage"], entry["charged"] = usage, entry["charged"] + amount_micros
        entry["chunks"] = [*entry["chunks"], chunk_key]
        self.balance_micros -= amount_micros
        self.debited_micros += amount_micros
        self.last_event = _movement("debit", amount_micros, sequence, at, batch_id, batch_endpoint(entry["endpoint"]))

    def settle(self, sequence: int, batch_id: str, ran: bool, at: int) -> None:
        """The batch ended: charge the batch minimum once any line ran, and give back the rest of the reservation.
        Only committed chunks' usage is charged, never a total the end states, nor more than the reservation."""
        entry = self.open.get(batch_id)
        if self.has_folded(sequence) or entry is None:
            return
        final = entry["charged"]
        if ran:
            final = max(final, _price(entry).minimum_micros)
        final = min(final, max(entry["held"], entry["charged"]))
        self._closed(sequence=sequence, batch_id=batch_id, extra_micros=final - entry["charged"], at=at, credit=False)

    @event("Closed")
    def _closed(self, sequence: int, batch_id: str, extra_micros: int, at: int, credit: bool) -> None:
        self.last_sequence = sequence
        if credit:
            self.credit_sequence = sequence
        entry = self.open.pop(batch_id)
        endpoint = batch_endpoint(entry["endpoint"])
        charged = entry["charged"] + extra_micros
        self.balance_micros -= extra_micros
        self.debited_micros += extra_micros
        refund = max(entry["held"] - charged, 0)
        if extra_micros:
            self.last_event = _movement("debit", extra_micros, sequence, at, batch_id, endpoint)
        if refund or not extra_micros:
            self.last_event = _movement("release" if credit else "refund", refund, sequence, at, batch_id, endpoint)


def _price(entry: dict[str, Any]) -> ModelPrice:
    return ModelPrice.model_validate({k: None if v is None else Decimal(v) for k, v in entry["price"].items()})


def _movement(kind: str, amount_micros: int, sequence: int, at: int, batch_id: str | None = None,
              endpoint: str | None = None) -> Movement:
    return {"type": kind, "amount_micros": amount_micros, "batch_id": batch_id, "endpoint": endpoint, "at": at,
            "sequence": sequence}
