"""`/v1/batches`: create (the body parsed by `BatchCreateRequest`), list, retrieve, cancel, release and retry
batches; the rules are the use cases' (`usecases.batches`, `usecases.retry`)."""

from aiohttp import web

from contracts.api.batch import Batch
from contracts.api.batch_request import BatchCreateRequest
from contracts.lifecycle import ALL_STATUSES
from services.gateway.context import deps
from services.gateway.http.auth import REQUEST_KEY_DIGEST, principal
from services.gateway.http.bodies import answer, read_body
from services.gateway.http.limits import charge_control_call
from services.gateway.http.paging import parse_limit
from services.gateway.usecases import batches as usecase
from services.gateway.usecases import retry
from services.gateway.usecases.batch_list import Listing, batch_page, indexed
from services.gateway.usecases.batches import overseen_batch
from services.gateway.usecases.oversight import administered_organization, members_index
from services.gateway.usecases.refusals import ApiError, bad_request

MAX_JSON_BODY_BYTES = 1024 * 1024
IDEMPOTENCY_KEY_CHARS = (16, 80)


def _idempotency_key(request: web.Request) -> str | None:
    key = request.headers.get("Idempotency-Key")
    low, high = IDEMPOTENCY_KEY_CHARS
    if key is not None and not (low <= len(key) <= high and key.isascii() and key.isprintable()):
        raise bad_request(f"Idempotency-Key must be {low} to {high} printable ASCII characters.",
                          "invalid_idempotency_key", "Idempotency-Key")
    return key


async def create_batch(request: web.Request) -> web.Response:
    await charge_control_call(request)
    idempotency_key = _idempotency_key(request)
    body = await read_body(request, BatchCreateRequest, MAX_JSON_BODY_BYTES)
    created = await usecase.create_from(deps(request), principal(request), request[REQUEST_KEY_DIGEST], body,
                                        idempotency_key)
    return answer(created.batch, created.same_as)


async def list_batches(request: web.Request) -> web.Response:
    """The caller's batches; `scope=organization` an organisation's members' (its administrator, or an admin key
    naming `organization_id`), `scope=all` every batch (an admin key)."""
    d, caller = deps(request), principal(request)
    await d.own_writes.settle(d.read_model, caller.owner, ("batch",), d.settings.own_writes_wait_s)
    listing = await _listed(request, request.query.get("scope", "own"))
    status, search = request.query.get("status"), request.query.get("search")
    if status is not None and status not in ALL_STATUSES:  # said once, whatever the list holds
        raise bad_request(f"status must be one of {', '.join(sorted(ALL_STATUSES))} (got {status[:40]!r}).",
                          "invalid_status", "status")
    if search is not None and len(search) > MAX_SEARCH:
        raise bad_request(f"search must be at most {MAX_SEARCH} characters.", "invalid_search", "search")
    keep = None if status is None and not search else lambda batch: _matches(batch, status, search)
    return answer(await batch_page(listing, request.query.get("after"), parse_limit(request), keep))


MAX_SEARCH = 512
"""The longest `?search=` text (a metadata value is at most 512 characters)."""


def _matches(batch: Batch, status: str | None, search: str | None) -> bool:
    """`?status=` one status; `?search=` text in the id or a metadata key or value (`key=value`: that pair)."""
    if status is not None and batch.status != status:
        return False
    if not search:
        return True
    wanted = search.casefold()
    pairs = (batch.metadata or {}).items()
    key, eq, value = wanted.partition("=")
    if eq:
        return any(k.casefold() == key and value in v.casefold() for k, v in pairs)
    return wanted in batch.id.casefold() or any(wanted in k.casefold() or wanted in v.casefold() for k, v in pairs)


async def retrieve_batch(request: web.Request) -> web.Response:
    record, _ = await overseen_batch(deps(request), principal(request), request.match_info["batch_id"])
    return answer(record.batch)


async def _listed(request: web.Request, scope: str) -> Listing:
    d, caller = deps(request), principal(request)
    if scope == "own":
        return indexed(d.read_model, {caller.owner: await d.read_model.owner_batch_index(caller.owner)})
    if scope not in ("organization", "all"):
        raise bad_request(f"scope must be 'own', 'organization' or 'all' (got {scope!r}).", "invalid_scope", "scope")
    if caller.role == "admin":
        organization = request.query.get("organization_id")
        if scope == "all" or organization is None:
            return indexed(d.read_model, await d.read_model.every_batch_index())
        return indexed(d.read_model, await members_index(d.read_model, organization))
    admin = await administered_organization(d.read_model, caller)
    if scope == "all" or admin is None:
        raise ApiError(403, "Only an administrator of your organisation sees its members' batches (scope="
                            "organization), and only an admin key every batch (scope=all).", "permission_error",
                       "insufficient_permissions", "scope")
    return indexed(d.read_model, await members_index(d.read_model, admin.organization))


async def cancel_batch(request: web.Request) -> web.Response:
    """Cancel (extension: an organisation's administrator, or the platform's admin, may cancel others' batches)."""
    d, caller = deps(request), principal(request)
    record, by = await overseen_batch(d, caller, request.match_info["batch_id"])
    await charge_control_call(request)
    return answer(await usecase.cancel(d, caller, record, by))


async def release_batch(request: web.Request) -> web.Response:
    """`POST /v1/batches/{id}/release` (extension): run a batch created with `hold` once it is validated."""
    d, caller = deps(request), principal(request)
    record = await usecase.owned_batch(d, caller, request.match_info["batch_id"])
    await charge_control_call(request)
    return answer(await usecase.release(d, caller, record))


async def retry_batch(request: web.Request) -> web.Response:
    """`POST /v1/batches/{id}/retry` (extension): a new batch of the lines that failed in an ended one, linked to it."""
    await charge_control_call(request)
    d, caller = deps(request), principal(request)
    body = await read_body(request, retry.RetryRequest)
    record = await usecase.owned_batch(d, caller, request.match_info["batch_id"])
    created = await retry.retry(d, caller, request[REQUEST_KEY_DIGEST], record, body)
    return answer(created.batch, created.same_as)
