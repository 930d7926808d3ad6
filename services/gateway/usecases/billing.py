"""Billing at the gateway: a batch's worst-case price, its reservation, the balance and a quote; the ledger keeps the
accounts. A reservation is fenced on the account's last credit fact the read model showed (JetStream checks it with
the write), so two creates never spend the same credit; when another came first, the check is made again."""

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from decimal import Decimal

from pydantic import ValidationError

from contracts.api.billing import BalanceMovement, BillingBalance, QueueEstimate, QuotePrice
from contracts.billing import FileDemand, ModelPrice, micros_to_usd, parse_usd, worst_case_micros
from contracts.catalogue import Catalogue, CatalogueModel
from contracts.events.account import CreditsGranted, CreditsReserved
from contracts.events.registry import decode_event
from contracts.readmodel import AccountRecord, FileRecord
from contracts.subjects import account_facts
from services.gateway.usecases.refusals import ApiError
from services.runtime.nats import eventlog
from services.runtime.nats.bus import EventBus, Fence, FenceMoved
from services.runtime.nats.readmodel import ReadModel

FREE = ModelPrice(input_per_mtok_usd=Decimal(0), output_per_mtok_usd=Decimal(0))
"""What tokens cost on a deployment that does not bill."""
"""The window the fleet's rate for a model is measured over, for a quote's ETA."""
MAX_PRICE_KEY = "max_price_usd"


def pricing_unavailable(message: str) -> ApiError:
    return ApiError(409, message, "conflict_error", "pricing_unavailable", "model")


def batch_model(catalogue: Catalogue, file: FileRecord, default_model: str | None) -> CatalogueModel | None:
    """The model a batch on `file` runs on: the one named for lines without one, else the first a line names."""
    demand = file.demand
    named = default_model or (demand.model if demand is not None else None)
    return catalogue.resolve(named) if named else None


def worst_case(model: CatalogueModel, price: ModelPrice, demand: FileDemand, endpoint: str) -> tuple[int, int, int]:
    """(input tokens, output tokens, micro-USD) a batch on the file can cost at most."""
    input_tokens, output_tokens = demand.bounds(model.context_length, embeddings=endpoint == "/v1/embeddings")
    return input_tokens, output_tokens, worst_case_micros(price, input_tokens, output_tokens)


def price_of(model: CatalogueModel) -> ModelPrice:
    if model.price is None:
        raise pricing_unavailable(f"Model {model.id} has no price on this deployment, which bills batches; ask the "
                                  "operator to price it in the catalogue.")
    return model.price


def demand_of(file: FileRecord) -> FileDemand:
    if file.demand is None:
        raise pricing_unavailable(f"File {file.file.id} was uploaded before this deployment priced files; upload it "
                                  "again to create a billed batch on it.")
    return file.demand


def max_price(metadata: dict[str, str] | None) -> int | None:
    """`metadata.max_price_usd` in micro-USD; None when not set. A malformed one is a 400."""
    given = (metadata or {}).get(MAX_PRICE_KEY)
    if given is None:
        return None
    amount = parse_usd(given)
    if amount is None or amount < 0:
        raise ApiError(400, f"metadata.max_price_usd must be a decimal amount of USD such as \"3\" (got {given!r}).",
                       code="invalid_metadata", param="metadata.max_price_usd")
    return amount


def check_max_price(worst_micros: int, metadata: dict[str, str] | None) -> None:
    ceiling = max_price(metadata)
    if ceiling is not None and worst_micros > ceiling:
        raise ApiError(402, f"The batch's worst-case price is {micros_to_usd(worst_micros)} USD, above its "
                       f"metadata.max_price_usd of {micros_to_usd(ceiling)} USD; nothing was reserved. Lower the "
                       "lines' max_tokens or raise the ceiling.", code="price_above_max",
                       param="metadata.max_price_usd")


def insufficient_balance(needed: int, available: int) -> ApiError:
    return ApiError(402, f"The batch's worst-case price of {micros_to_usd(needed)} USD is more than your "
                    f"organisation's available credit of {micros_to_usd(available)} USD; nothing was reserved. Ask "
                    "an operator for credit, or lower the lines' max_tokens.", code="insufficient_balance")


async def reserve(bus: EventBus, read_model: ReadModel, account_id: str, batch_id: str, amount_micros: int,
                  price: ModelPrice, model: str, endpoint: str, wait_s: float) -> None:
    """Hold `amount_micros` of the account's credit for the batch, or raise 402 `insufficient_balance`."""
    deadline = time.monotonic() + wait_s
    seen = 0  # the account's last credit fact must be folded at least this far before we judge on it
    while True:
        record = await read_model.wait_for(lambda: read_model.get_account(account_id),
                                           _folded_past(seen), max(deadline - time.monotonic(), 0.0))
        folded = record.credit_sequence if record is not None else 0
        if folded < seen:
            raise ApiError(503, "The ledger has not caught up with your organisation's account; try again shortly.",
                           "server_error", "ledger_behind", retry_after_s=2)
        available = record.available_micros if record is not None else 0
        if available < amount_micros:
            raise insufficient_balance(amount_micros, available)
        fence = Fence(account_facts(account_id), folded)
        fact = CreditsReserved(aggregate_id=account_id, batch_id=batch_id, amount_micros=amount_micros, price=price,
                               model=model, endpoint=endpoint)
        try:
            await bus.publish(fact, fence=fence)
            return
        except FenceMoved as moved:
            seen = moved.last_sequence  # another create or a grant came first: judge again on the ledger's view
            if time.monotonic() > deadline:
                raise ApiError(503, "Too many batches are being created on your organisation's account at once; try "
                               "again shortly.", "server_error", "account_busy", retry_after_s=1) from None
            await asyncio.sleep(0)


def _folded_past(sequence: int) -> Callable[[AccountRecord], bool]:
    return lambda record: record.credit_sequence >= sequence


async def grant(bus: EventBus, read_model: ReadModel, account_id: str, amount_micros: int, note: str,
                granted_by: str, grant_id: str | None = None, wait_s: float = 5.0) -> CreditsGranted:
    """State the grant, and wait (at most `wait_s`) until the ledger shows it. A `grant_id` the account's log holds
    already is that grant, however long ago it was made (the broker's dedup spans two minutes only): the same amount
    and note answer it again, anything else is a 409. The publish is fenced on the account's last grant, so two
    grants of one id racing make one."""
    fact = CreditsGranted(aggregate_id=account_id, grant_id=grant_id or f"grant_{uuid.uuid4().hex[:24]}",
                          amount_micros=amount_micros, note=note, granted_by=granted_by)
    deadline = time.monotonic() + wait_s
    while True:
        earlier, last = await _earlier_grant(bus, fact) if grant_id is not None else (None, 0)
        if earlier is not None:
            stated, sequence = earlier
            if (stated.amount_micros, stated.note) != (amount_micros, note):
                raise ApiError(409, f"grant_id {grant_id} names an earlier grant of another amount or note; use a new "
                               "grant_id for a new grant.", "conflict_error", "idempotency_conflict", "grant_id")
            fact = stated
            break
        try:
            sequence = await bus.publish(fact, fence=Fence(fact.subject, last) if grant_id is not None else None)
            break
        except FenceMoved:  # another grant to the account came first: look again
            if time.monotonic() > deadline:
                raise ApiError(503, "Too many grants are being made to this account at once; try again shortly.",
                               "server_error", "account_busy", retry_after_s=1) from None
    await read_model.wait_for(lambda: read_model.get_account(account_id), _folded_past(sequence), wait_s)
    return fact


async def _earlier_grant(bus: EventBus, fact: CreditsGranted) -> tuple[tuple[CreditsGranted, int] | None, int]:
    """The account's grant of `fact.grant_id` in the log and its sequence, if any; and its last grant's sequence (0:
    none), which the publish of a new one is fenced on."""
    found, last = None, 0
    async for stored in eventlog.read(bus, fact.subject):
        last = stored.sequence
        with contextlib.suppress(ValidationError):  # a fact this release cannot read is no grant of this id
            earlier = decode_event(stored.data)
            if isinstance(earlier, CreditsGranted) and earlier.grant_id == fact.grant_id:
                found = earlier, stored.sequence
    return found, last


def balance(account_id: str, record: AccountRecord | None, enabled: bool) -> BillingBalance:
    record = record or AccountRecord(account_id=account_id, balance_micros=0, reserved_micros=0, last_sequence=0)
    last = record.last_event
    return BillingBalance(
        organization_id=account_id, billing_enabled=enabled, balance_usd=micros_to_usd(record.balance_micros),
        reserved_usd=micros_to_usd(record.reserved_micros), available_usd=micros_to_usd(record.available_micros),
        granted_usd=micros_to_usd(record.granted_micros), debited_usd=micros_to_usd(record.debited_micros),
        open_batches=record.open_batches,
        last_event=None if last is None else BalanceMovement(
            type=last.type, amount_usd=micros_to_usd(last.amount_micros), endpoint=last.endpoint,
            batch_id=last.batch_id, created_at=last.at))


def quote_price(model: CatalogueModel, price: ModelPrice, demand: FileDemand, endpoint: str) -> QuotePrice:
    input_max, output_max, worst = worst_case(model, price, demand, endpoint)
    least = max(price.cost_micros(input_max, 0, cached_tokens=input_max), price.minimum_micros) if demand.lines \
        else 0
    estimate = max(price.cost_micros(input_max, output_max // 2), price.minimum_micros) if demand.lines else 0
    return QuotePrice(min_usd=micros_to_usd(least), estimate_usd=micros_to_usd(estimate),
                      max_usd=micros_to_usd(worst if demand.lines else 0))


def queue_estimate(ahead: int, rate: float | None, lines: int) -> QueueEstimate:
    """Lines of the model still to run (`ahead`), the fleet's rate for it over the last hour, and when `lines` more
    would be done at that rate (a newcomer's wait at most, the fair queue sharing the fleet)."""
    eta = int((ahead + lines) / rate) + 1 if rate else None
    return QueueEstimate(lines_ahead=ahead, lines_per_s=None if rate is None else round(rate, 3), eta_s=eta)
