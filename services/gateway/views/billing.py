"""`/v1/billing/…` and `POST /v1/batches/quote`: an organisation's balance (InferNode's `GET /v1/billing/balance`),
operators' grants and the accounts list, and what a batch on a file would cost without reserving anything."""

import re
import time

from aiohttp import web

from contracts.api.billing import BatchQuote, BillingBalance, Grant, GrantCredits, QueueEstimate, QuoteRequest
from contracts.api.organization import USER_ID_PATTERN
from contracts.api.page import ListPage
from contracts.billing import micros_to_usd, parse_usd
from services.gateway.background.fleet_gauges import counted_census
from services.gateway.context import deps
from services.gateway.http.auth import principal
from services.gateway.http.bodies import answer, read_body
from services.gateway.usecases import billing
from services.gateway.usecases.batches import batch_input
from services.gateway.usecases.oversight import administered_organization, existing_organization, organization_of
from services.gateway.usecases.refusals import ApiError, bad_request


async def _account_id(request: web.Request) -> str:
    """The caller's organisation's account, or `?organization_id=`'s for an admin key (or its own administrator)."""
    user = await deps(request).keys.user_of(principal(request))
    own = organization_of(user)
    asked = request.query.get("organization_id")
    if asked is not None and not re.fullmatch(USER_ID_PATTERN, asked):
        raise bad_request(f"organization_id must be 1-64 letters, digits, '_' or '-' (got {asked[:64]!r}).",
                          "invalid_id", "organization_id")
    if asked is None or asked == own or principal(request).role == "admin":
        return asked or own
    admin = await administered_organization(deps(request).read_model, principal(request))
    if admin is not None and organization_of(admin) == asked:
        return asked
    raise ApiError(403, "Only an admin key may read another organisation's balance.", "permission_error",
                   "insufficient_permissions", "organization_id")


async def get_balance(request: web.Request) -> web.Response:
    d = deps(request)
    account_id = await _account_id(request)
    return answer(billing.balance(account_id, await d.read_model.get_account(account_id), d.settings.billing))


async def list_accounts(request: web.Request) -> web.Response:
    """Every account with a movement, for the operator page (an admin key)."""
    d = deps(request)
    records = sorted(await d.read_model.list_accounts(), key=lambda r: r.account_id)
    return answer(ListPage[BillingBalance](data=[billing.balance(r.account_id, r, d.settings.billing)
                                                 for r in records]))


async def grant_credits(request: web.Request) -> web.Response:
    key = principal(request)
    body = await read_body(request, GrantCredits)
    amount = parse_usd(body.amount_usd)
    if amount is None or amount == 0:
        raise bad_request(f"amount_usd must be a non-zero amount of USD (got {body.amount_usd!r}).", "invalid_amount",
                          "amount_usd")
    d = deps(request)
    await existing_organization(d.read_model, body.organization_id)
    fact = await billing.grant(d.bus, d.read_model, body.organization_id, amount, body.note, key.key_id,
                               body.grant_id, d.settings.read_your_writes_s)
    return answer(Grant(id=fact.grant_id, organization_id=fact.aggregate_id, amount_usd=micros_to_usd(amount),
                        note=fact.note))


async def quote_batch(request: web.Request) -> web.Response:
    d = deps(request)
    body = await read_body(request, QuoteRequest)
    file = await batch_input(d, principal(request), body.input_file_id)
    default_model = (body.metadata or {}).get("model") or file.model
    model = billing.batch_model(d.catalogue, file, default_model)
    if model is None:
        raise bad_request("The file names no model this deployment serves: name one in its lines, at upload "
                          "(x-litellm-model or ?model=) or in metadata.model.", "model_not_found", "model")
    endpoint = body.endpoint or model.endpoints[0]
    demand = billing.demand_of(file)
    price = billing.price_of(model) if d.settings.billing else billing.FREE  # the token bounds never depend on it
    input_max, output_max, worst = billing.worst_case(model, price, demand, endpoint)
    available: int | None = None
    if d.settings.billing:
        billing.max_price(body.metadata)  # a malformed ceiling is refused here as the create would refuse it
        record = await d.read_model.get_account(organization_of(await d.keys.user_of(principal(request))))
        available = record.available_micros if record is not None else 0
    return answer(BatchQuote(
        input_file_id=file.file.id, model=model.id, endpoint=endpoint, billing_enabled=d.settings.billing,
        lines=demand.lines, input_tokens_max=input_max, output_tokens_max=output_max,
        price=billing.quote_price(model, price, demand, endpoint),
        available_usd=None if available is None else micros_to_usd(available),
        fits_balance=available is None or worst <= available,
        queue=await _queue(request, model.id, demand.lines)))


async def _queue(request: web.Request, model_id: str, lines: int) -> QueueEstimate:
    """The queue a batch of `lines` would join, from the gateway's batch census: no batch record is read."""
    census = await counted_census(request.app)
    return billing.queue_estimate(*census.queue(model_id, time.time()), lines)
