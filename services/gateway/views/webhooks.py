"""`/v1/webhooks/…`: webhook endpoints and their deliveries. A user manages their own (`scope=user`), an organisation's
administrator also its `scope=organization` ones, an admin key any; the secret is shown at create and rotate only."""

import asyncio
import re
import secrets
import time

from aiohttp import web
from yarl import URL

from contracts.api.organization import USER_ID_PATTERN
from contracts.api.webhook import (
    WEBHOOK_EVENT_TYPES,
    CreateWebhook,
    DeletedWebhook,
    UpdateWebhook,
    WebhookDelivery,
    WebhookEndpoint,
)
from contracts.readmodel import ApiKeyRecord
from services.gateway.adapters.admission import Holdings
from services.gateway.context import deps
from services.gateway.http.auth import principal
from services.gateway.http.bodies import answer, read_body
from services.gateway.http.limits import charge_control_call
from services.gateway.http.paging import limit_of, page_after
from services.gateway.usecases.oversight import administered_organization, organization_of
from services.gateway.usecases.refusals import ApiError, bad_request, not_found
from services.gateway.webhooks.deliverer import WEBHOOK_DIRECTORY, WEBHOOK_STORE
from services.gateway.webhooks.directory import DirectoryNotReady, Endpoints
from services.gateway.webhooks.signing import new_secret
from services.gateway.webhooks.store import WebhookStore
from services.gateway.webhooks.targets import (
    AddressPolicy,
    literal_address,
    numeric_address,
    parse_networks,
    refusal,
    standard_address,
)
from services.runtime.nats.kv import ScanFailed

WEBHOOKS = "webhooks"
"""The admission limit of endpoints per owner (`max_webhooks_per_owner`)."""
MAX_DELIVERIES_LISTED = 100
ID_PATTERN = r"(wh|msg)_[0-9a-f]{24}"
RESOLVE_TIMEOUT_S = 5.0
"""How long registering an endpoint waits for its host name to resolve (one that does not may still register)."""
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f-\x9f]")
"""Never in a URL as it is (yarl drops some, such as a tab, so the URL checked would not be the URL kept)."""
MAX_HOST_NAME, MAX_LABEL = 253, 63


def _store(request: web.Request) -> WebhookStore:
    return request.app[WEBHOOK_STORE]


async def _endpoints(request: web.Request) -> Endpoints:
    """Every endpoint as routed now, with each endpoint write acknowledged before this request in it."""
    try:
        return await request.app[WEBHOOK_DIRECTORY].current_endpoints(_store(request).kv)
    except (DirectoryNotReady, ScanFailed) as error:
        raise ApiError(503, "The webhook endpoints could not be read just now; retry shortly.", "server_error",
                       "server_busy", retry_after_s=1) from error


async def _visible(request: web.Request, caller: ApiKeyRecord) -> list[WebhookEndpoint]:
    """The endpoints the caller manages (`_manages`), read only by their ids: never every tenant's endpoints."""
    store = _store(request)
    if caller.role == "admin":
        return await store.list_endpoints()
    admin = await administered_organization(deps(request).read_model, caller)
    organization = organization_of(admin) if admin is not None else None
    return await store.get_endpoints((await _endpoints(request)).managed_by(caller.owner, organization))


async def _manages(request: web.Request, caller: ApiKeyRecord, endpoint: WebhookEndpoint) -> bool:
    if caller.role == "admin" or endpoint.owner == caller.owner:
        return True
    if endpoint.scope != "organization":
        return False
    admin = await administered_organization(deps(request).read_model, caller)
    return admin is not None and organization_of(admin) == endpoint.organization_id


async def _managed_endpoint(request: web.Request) -> WebhookEndpoint:
    """The endpoint the path names, when the caller manages it; 404 otherwise (as if it were not there)."""
    endpoint_id = request.match_info["webhook_id"]
    if not re.fullmatch(ID_PATTERN, endpoint_id):  # not one of ours (and not a valid bucket key)
        raise not_found("webhook endpoint", endpoint_id[:100])
    endpoint = await _store(request).get_endpoint(endpoint_id)
    if endpoint is None or not await _manages(request, principal(request), endpoint):
        raise not_found("webhook endpoint", endpoint_id)
    return endpoint


def _host_name(host: str) -> bool:
    """Whether a URL's host as yarl encodes it (ASCII) is an IP address or a name DNS can hold: labels of 1 to 63
    characters, 253 in all (the resolver refuses any other before it looks)."""
    if literal_address(host):
        return True
    name = host.removesuffix(".")
    return 0 < len(name) <= MAX_HOST_NAME and all(0 < len(label) <= MAX_LABEL for label in name.split("."))


async def _checked_url(request: web.Request, url: str) -> str:
    """`url` if it is absolute http(s) to an address the policy allows (checked again at every attempt)."""
    if CONTROL_CHARACTERS.search(url):
        raise bad_request("url holds control characters.", "invalid_url", "url")
    try:
        parsed = URL(url)
        decoded = parsed.host  # yarl decodes an IDNA host only when asked: its UnicodeError is a ValueError
    except ValueError as error:
        raise bad_request(f"url is not a URL: {error}", "invalid_url", "url") from error
    settings = deps(request).settings
    allowed = ("https",) if settings.webhook_require_https else ("https", "http")
    host, port = parsed.raw_host, parsed.port
    if parsed.scheme not in allowed or not decoded or not host or port is None:
        raise bad_request(f"url must be an absolute {' or '.join(s + '://' for s in allowed)} URL (got {url[:200]!r}).",
                          "invalid_url", "url")
    if not _host_name(host):
        raise bad_request(f"url's host is not a host name (got {host[:200]!r}).", "invalid_url", "url")
    policy = AddressPolicy(parse_networks(settings.webhook_allowed_cidrs))
    # The name a delivery connects to (aiohttp resolves the encoded host), so the one checked here.
    why = await refusal(host, port, policy, RESOLVE_TIMEOUT_S, settings.webhook_nameservers)
    if why is not None:
        raise bad_request(f"url is refused: {why[:300]} (webhooks go to public addresses only, unless the operator "
                          "allows more).", "invalid_webhook_url", "url")
    if literal_address(host) and not standard_address(host):
        raise bad_request(f"url's host {host[:100]!r} spells an address the C library reads, not as addresses are "
                          f"written (write it as {numeric_address(host)}).", "invalid_url", "url")
    return url


async def _scope_organization(request: web.Request, caller: ApiKeyRecord, body: CreateWebhook) -> str:
    """The organisation an endpoint belongs to (`scope=organization`: its administrator's, or an admin key's)."""
    if body.organization_id is not None and body.scope == "organization" and caller.role == "admin":
        if not re.fullmatch(USER_ID_PATTERN, body.organization_id):
            raise bad_request("organization_id must be 1-64 letters, digits, '_' or '-'.", "invalid_id",
                              "organization_id")
        return body.organization_id
    own = organization_of(await deps(request).keys.user_of(caller))
    if body.scope == "user" or caller.role == "admin":
        if body.organization_id is not None and body.organization_id != own:
            raise bad_request("organization_id is for scope=organization by an admin key.", "invalid_request",
                              "organization_id")
        return own
    admin = await administered_organization(deps(request).read_model, caller)
    if admin is None or (body.organization_id is not None and body.organization_id != organization_of(admin)):
        raise ApiError(403, "Only an administrator of the organisation may register an organisation-wide webhook.",
                       "permission_error", "insufficient_permissions", "scope")
    return organization_of(admin)


async def create_webhook(request: web.Request) -> web.Response:
    caller = principal(request)
    body = await read_body(request, CreateWebhook)
    await charge_control_call(request)
    url = await _checked_url(request, body.url)
    organization = await _scope_organization(request, caller, body)
    store = _store(request)
    endpoint = WebhookEndpoint(
        id=f"wh_{secrets.token_hex(12)}", url=url, events=list(body.events or WEBHOOK_EVENT_TYPES), scope=body.scope,
        owner=caller.owner, organization_id=organization, enabled=True, description=body.description,
        created_at=int(time.time()), secret=new_secret())
    holder = webhooks_holder(endpoint)

    async def held(listed: frozenset[str]) -> Holdings:
        endpoints = await _endpoints(request)
        return Holdings(dict.fromkeys(endpoints.counted_with(endpoint), 1), frozenset(listed & endpoints.by_id.keys()))

    limit = deps(request).settings.max_webhooks_per_owner
    admission = deps(request).admission
    if await admission.take(WEBHOOKS, holder, endpoint.id, 1, limit, held) is not None:
        raise bad_request(f"At most {limit} webhook endpoints may be registered here; delete one first.",
                          "too_many_webhooks")
    try:
        await store.put_endpoint(endpoint)
    except BaseException:
        await asyncio.shield(admission.release(WEBHOOKS, holder, endpoint.id))
        raise
    return answer(endpoint)


async def list_webhooks(request: web.Request) -> web.Response:
    caller = principal(request)
    visible = [endpoint.model_copy(update={"secret": None}) for endpoint in await _visible(request, caller)]
    return answer(page_after(visible, [endpoint.id for endpoint in visible], None, len(visible)))


async def retrieve_webhook(request: web.Request) -> web.Response:
    endpoint = await _managed_endpoint(request)
    return answer(endpoint.model_copy(update={"secret": None}))


async def update_webhook(request: web.Request) -> web.Response:
    endpoint = await _managed_endpoint(request)
    body = await read_body(request, UpdateWebhook)
    await charge_control_call(request)
    changes = body.model_dump(exclude_none=True)
    if body.url is not None:
        changes["url"] = await _checked_url(request, body.url)
    changed = await _store(request).change_endpoint(endpoint.id, lambda now: now.model_copy(update=changes))
    if changed is None:  # deleted meanwhile
        raise not_found("webhook endpoint", endpoint.id)
    return answer(changed.model_copy(update={"secret": None}))


async def rotate_secret(request: web.Request) -> web.Response:
    """A new signing secret, in force for every attempt from now on (the old one is forgotten)."""
    endpoint = await _managed_endpoint(request)
    await charge_control_call(request)
    secret = new_secret()
    changed = await _store(request).change_endpoint(endpoint.id, lambda now: now.model_copy(update={"secret": secret}))
    if changed is None:  # deleted meanwhile
        raise not_found("webhook endpoint", endpoint.id)
    return answer(changed)


def webhooks_holder(endpoint: WebhookEndpoint) -> str:
    """Whose limit of endpoints an endpoint counts against: its owner's, or its organisation's."""
    return endpoint.owner if endpoint.scope == "user" else f"organization-{endpoint.organization_id}"


async def delete_webhook(request: web.Request) -> web.Response:
    endpoint = await _managed_endpoint(request)
    await charge_control_call(request)
    await _store(request).delete_endpoint(endpoint.id)
    # Its place comes back at once (the store forgets a deleted endpoint, so the admission would count it until
    # its grace ends).
    await asyncio.shield(deps(request).admission.release(WEBHOOKS, webhooks_holder(endpoint), endpoint.id))
    return answer(DeletedWebhook(id=endpoint.id))


async def list_deliveries(request: web.Request) -> web.Response:
    """The endpoint's deliveries, newest first, each with its attempts (`?status=` pending, delivered or failed)."""
    endpoint = await _managed_endpoint(request)
    status = request.query.get("status")
    if status is not None and status not in ("pending", "delivered", "failed"):
        raise bad_request("status must be pending, delivered or failed.", "invalid_request", "status")
    limit = limit_of(request.query.get("limit"), 20, MAX_DELIVERIES_LISTED)
    found = [d for d in await _store(request).list_deliveries(endpoint.id) if status is None or d.status == status]
    return answer(page_after(found, [d.id for d in found], None, limit))


async def redeliver(request: web.Request) -> web.Response:
    """Send a delivery again now: pending again, with the same `webhook-id` and its earlier attempts kept."""
    endpoint = await _managed_endpoint(request)
    await charge_control_call(request)
    store = _store(request)
    delivery_id = request.match_info["delivery_id"]
    delivery = await store.get_delivery(endpoint.id, delivery_id) if re.fullmatch(ID_PATTERN, delivery_id) else None
    if delivery is None:
        raise not_found("webhook delivery", delivery_id[:100])
    if delivery.status != "pending":
        def pending_again(stored: WebhookDelivery) -> WebhookDelivery | None:
            if stored.status == "pending":
                return None  # made pending meanwhile (a redelivery asked at the same time)
            return stored.model_copy(update={"status": "pending", "next_attempt_at": time.time()})

        changed = await store.change_delivery(endpoint.id, delivery_id, pending_again)
        if changed is None:  # erased meanwhile (ended past its retention): not made again
            raise not_found("webhook delivery", delivery_id[:100])
        delivery = changed
        await store.add_delivery(delivery)
    return answer(delivery)
