"""`/v1/batches`: create (the body parsed by `BatchCreateRequest`), list, retrieve, cancel and release batches."""

import asyncio
import logging
import time

from aiohttp import web

from contracts.api.batch import Batch
from contracts.api.batch_request import BatchCreateRequest
from contracts.billing import ModelPrice
from contracts.catalogue import CatalogueModel
from contracts.events.batch import BatchCancelRequested, BatchCreated, BatchReleased
from contracts.events.file import FileUsed
from contracts.ids import derived_id, new_batch_id, owner_id
from contracts.lifecycle import ALL_STATUSES, CANCELLABLE, RELEASABLE, TERMINAL
from contracts.readmodel import BatchRecord, FileRecord
from contracts.subjects import batch_fact, file_fact
from services.gateway.admission import ADMISSION, Holdings
from services.gateway.auth import KEY_CACHE, principal
from services.gateway.context import Deps, deps
from services.gateway.errors import ApiError, bad_request, not_found
from services.gateway.limits import charge_control_call
from services.gateway.oversight import (
    Standing,
    administered_organization,
    cancel_entry,
    members_batches,
    organization_of,
    standing,
)
from services.gateway.usecases import billing as billing_usecase
from services.gateway.views.bodies import read_body
from services.gateway.views.files import DEDUPLICATED_FROM, is_valid_id, owned_file
from services.gateway.views.paging import page_after, parse_limit
from services.runtime.bus import Fence, FenceMoved
from services.runtime.facts import last_fact

log = logging.getLogger(__name__)

MAX_WINDOW_S = 168 * 3600
MAX_JSON_BODY_BYTES = 1024 * 1024
ACTIVE_BATCHES = "active_batches"
IDEMPOTENCY_KEY_CHARS = (16, 80)


async def owned_batch(request: web.Request, batch_id: str) -> BatchRecord:
    return (await overseen_batch(request, batch_id, overseers=False))[0]


async def overseen_batch(request: web.Request, batch_id: str, overseers: bool = True) -> tuple[BatchRecord, Standing]:
    """The batch, if the caller owns it or (with `overseers`) administers its owner: the platform's admin, or an
    administrator of the owner's organisation. Anyone else is told it does not exist."""
    d, caller = deps(request), principal(request)
    record = await d.read_model.get_batch(batch_id) if is_valid_id(batch_id) else None
    if record is None and d.own_writes.awaits(caller.owner, "batch", batch_id):  # created here a moment ago
        await d.own_writes.settle(d.read_model, caller.owner, ("batch",), d.settings.own_writes_wait_s)
        record = await d.read_model.get_batch(batch_id)
    if record is None:
        raise not_found("batch", batch_id)
    if record.owner == caller.owner:
        return record, "owner"
    by = await standing(d.read_model, caller, record.owner) if overseers else None
    if by is None:
        raise not_found("batch", batch_id)
    return record, by


def completion_window_seconds(window: object, min_window_s: int) -> int:
    """`24h` (OpenAI's) up to `168h`: how long the batch may take before it expires. `m` and `s` units exist for
    deployments that lower the minimum (tests of expiry)."""
    units = {"h": 3600, "m": 60, "s": 1}
    amount = window[:-1] if isinstance(window, str) and window[-1:] in units else ""
    ascii_digits = amount.isascii() and amount.isdigit() and len(amount) < 10
    seconds = int(amount) * units[str(window)[-1]] if ascii_digits else 0
    if not min_window_s <= seconds <= MAX_WINDOW_S:
        raise bad_request(f"completion_window must be between '{min_window_s // 3600}h' and '168h' (got {window!r}).",
                          "invalid_completion_window", "completion_window")
    return seconds


def _idempotency_key(request: web.Request) -> str | None:
    key = request.headers.get("Idempotency-Key")
    low, high = IDEMPOTENCY_KEY_CHARS
    if key is not None and not (low <= len(key) <= high and key.isprintable()):
        raise bad_request(f"Idempotency-Key must be {low} to {high} printable characters.",
                          "invalid_idempotency_key", "Idempotency-Key")
    return key


CreateParameters = tuple[str, str, str, dict[str, str] | None, bool, bool, int | None, str]
"""Everything a create asks for: file, endpoint, window, metadata, allow_partial, hold, output_expires_after,
placement."""


def parameters_of(created: BatchCreated) -> CreateParameters:
    return (created.input_file_id, created.endpoint, created.completion_window, created.metadata,
            created.allow_partial, created.hold, created.output_expires_after_s, created.placement)


async def _created_parameters(d: Deps, batch_id: str) -> CreateParameters | None:
    """What the batch was created with, read from its own `created` fact (the read model does not keep it all)."""
    found = await last_fact(d.bus, batch_fact(batch_id, "created"))
    return parameters_of(found[1]) if found is not None and isinstance(found[1], BatchCreated) else None


def _answer(batch: Batch, same_as: str | None = None) -> web.Response:
    """A batch; `same_as` says it is an earlier batch returned for an identical create (a retry or a twin)."""
    return web.json_response(batch.model_dump(mode="json"), headers={DEDUPLICATED_FROM: same_as} if same_as else None)


def _idempotency_conflict(key: str, batch_id: str) -> ApiError:
    return ApiError(409, f"Idempotency-Key {key!r} was used for batch {batch_id} with a different request body; "
                    "use a new key for a new batch.", "conflict_error", "idempotency_conflict", "Idempotency-Key")


async def _live_batches(request: web.Request, owner: str) -> list[Batch]:
    return [record.batch for record in await deps(request).read_model.owner_live_batches(owner)]


async def _admit(request: web.Request, owner: str, batch_id: str) -> None:
    """Take one of the owner's active-batch places for `batch_id` (atomically across gateways), else 429."""
    d = deps(request)

    async def held(listed: frozenset[str]) -> Holdings:  # the owner's live list, not their whole history
        # The records first, then the list: an admitted batch the read model shows is on the list read after
        # (or ended), so it is counted once, by the list or as still pending, never by neither.
        shown = await asyncio.gather(*(d.read_model.get_batch(batch_id) for batch_id in listed))
        live = await d.read_model.owner_live_batch_ids(owner)
        return Holdings(dict.fromkeys(live, 1), live | {record.batch.id for record in shown if record is not None})

    limit = d.settings.max_active_batches
    used = await request.app[ADMISSION].take(ACTIVE_BATCHES, owner, batch_id, 1, limit, held)
    if used is not None:
        raise ApiError(429, f"You already have {used} batches that have not ended (the limit is {limit}); wait "
                       "for some to end or cancel them.", "rate_limit_error", "too_many_active_batches")


async def create_batch(request: web.Request) -> web.Response:
    await charge_control_call(request)
    idempotency_key = _idempotency_key(request)
    body = await read_body(request, BatchCreateRequest, MAX_JSON_BODY_BYTES)
    return await create_from(request, body, idempotency_key)


async def create_from(request: web.Request, body: BatchCreateRequest, idempotency_key: str | None) -> web.Response:
    """Create the batch `body` asks for (the create route's, and a retry's): idempotent by key, deduplicated
    against a live twin, billed when the deployment bills."""
    d = deps(request)
    window_s = completion_window_seconds(body.completion_window, d.settings.min_completion_window_s)
    input_file_id, metadata, hold = body.input_file_id, body.metadata, body.hold
    output_expires_after_s = body.output_expires_after.seconds if body.output_expires_after else None
    owner = principal(request).owner
    asked: CreateParameters = (input_file_id, body.endpoint, body.completion_window, metadata, body.allow_partial,
                               hold, output_expires_after_s, body.placement)
    batch_id = derived_id("batch_", owner, idempotency_key) if idempotency_key else new_batch_id()
    if idempotency_key and (earlier := await d.read_model.get_batch(batch_id)) is not None:
        if await _created_parameters(d, batch_id) != asked:
            raise _idempotency_conflict(idempotency_key, batch_id)
        return _answer(earlier.batch, batch_id)
    file = await owned_file(request, input_file_id)
    if file.file.purpose != "batch":
        raise bad_request(f"File {input_file_id} has purpose {file.file.purpose!r}; a batch needs purpose 'batch'.",
                          "invalid_input_file", "input_file_id")
    live = await _live_batches(request, owner)
    if not idempotency_key:
        # The very same create while the first still runs (a client's blind retry): the first is the answer. Any
        # parameter that differs makes it a batch of its own.
        for twin in live:
            if (twin.input_file_id, twin.endpoint, twin.completion_window) == asked[:3] \
                    and await _created_parameters(d, twin.id) == asked:
                return _answer(twin, twin.id)
    await _admit(request, owner, batch_id)
    try:
        user = await request.app[KEY_CACHE].user_of(principal(request))
        default_model = (metadata or {}).get("model") or file.model
        billing = _billing_plan(d, file, default_model, body.endpoint, metadata) if d.settings.billing else None
        await _claim_file(d, input_file_id, batch_id)
        account = billing_usecase.account_of(user)
        if billing is not None:
            model, price, amount = billing
            await billing_usecase.reserve(d.bus, d.read_model, account, batch_id, amount, price, model.id,
                                          body.endpoint, d.settings.read_your_writes_s)
    except BaseException:  # refused before it was published: its place is free again
        await asyncio.shield(request.app[ADMISSION].release(ACTIVE_BATCHES, owner, batch_id))
        raise
    now = int(time.time())
    event = BatchCreated(aggregate_id=batch_id, owner_key_id=principal(request).key_id, input_file_id=input_file_id,
                         input_object_key=file.object_key, endpoint=body.endpoint,
                         completion_window=body.completion_window, metadata=metadata, created_at=now,
                         expires_at=now + window_s, allow_partial=body.allow_partial, hold=hold,
                         output_expires_after_s=output_expires_after_s,
                         allowed_models=None if user is None else user.allowed_models,
                         owner_user_id=principal(request).user_id,
                         organization_id=None if user is None else user.organization_id,
                         default_model=default_model, billing_account=account if billing is not None else None,
                         placement=body.placement)
    try:
        await d.bus.publish(event)
    except BaseException:
        if billing is not None:  # the batch may not exist: its reservation must not hold credit for ever
            await asyncio.shield(_release_quietly(d, account, batch_id))
        raise
    if idempotency_key and await _created_parameters(d, batch_id) != asked:
        raise _idempotency_conflict(idempotency_key, batch_id)  # a concurrent request with this key won
    record = await d.read_model.wait_for(lambda: d.read_model.get_batch(batch_id), lambda r: True,
                                         d.settings.read_your_writes_s)
    if record is None:
        d.own_writes.note(owner, "batch", batch_id)  # the owner's next list waits for it
    batch = record.batch if record else Batch(
        id=batch_id, endpoint=event.endpoint, input_file_id=input_file_id, completion_window=event.completion_window,
        status="validating", created_at=now, expires_at=event.expires_at, metadata=metadata, held=hold or None,
        placement=body.placement)
    return _answer(batch)


def _billing_plan(d: Deps, file: FileRecord, default_model: str | None, endpoint: str,
                  metadata: dict[str, str] | None) -> tuple[CatalogueModel, ModelPrice, int] | None:
    """The model, price and worst case a billed create reserves; None when the upload names no model the catalogue
    knows (validation then fails the batch, and nothing runs)."""
    model = billing_usecase.batch_model(d.catalogue, file, default_model)
    if model is None:
        return None
    price = billing_usecase.price_of(model)
    _, _, worst = billing_usecase.worst_case(model, price, billing_usecase.demand_of(file), endpoint)
    billing_usecase.check_max_price(worst, metadata)
    return model, price, worst


async def _release_quietly(d: Deps, account: str, batch_id: str) -> None:
    if await d.read_model.get_batch(batch_id) is not None:
        return  # it was created after all: its end settles the reservation
    try:
        await billing_usecase.release(d.bus, account, batch_id, "the batch's creation failed")
    except Exception:  # the broker is unreachable: the reservation stays until an operator releases it
        log.exception("could not release the reservation of batch %s", batch_id)


async def _claim_file(d: Deps, file_id: str, batch_id: str) -> None:
    """Record that a batch is being created on the file, unless the file was deleted meanwhile (then 404)."""
    try:
        await d.bus.publish(FileUsed(aggregate_id=file_id, batch_id=batch_id),
                            fence=Fence(file_fact(file_id, "deleted"), 0))
    except FenceMoved:
        raise not_found("file", file_id) from None


async def list_batches(request: web.Request) -> web.Response:
    """The caller's batches; `?scope=organization` an organisation administrator's members' batches (an admin key:
    with `organization_id`, that organisation's), `?scope=all` every batch (an admin key)."""
    d, caller = deps(request), principal(request)
    await d.own_writes.settle(d.read_model, caller.owner, ("batch",), d.settings.own_writes_wait_s)
    records = await _listed(request, request.query.get("scope", "own"))
    mine = [r.batch for r in records if _matches(r.batch, request.query.get("status"), request.query.get("search"))]
    mine.sort(key=lambda b: (b.created_at, b.id), reverse=True)
    page = page_after(mine, [b.id for b in mine], request.query.get("after"), parse_limit(request))
    return web.json_response(page.model_dump(mode="json"))


def _matches(batch: Batch, status: str | None, search: str | None) -> bool:
    """`?status=` one status (extension); `?search=` text found in the batch's id or in a metadata key or value
    (`key=value` matches that pair), case-insensitive."""
    if status is not None and status not in ALL_STATUSES:
        raise bad_request(f"status must be one of {', '.join(sorted(ALL_STATUSES))} (got {status[:40]!r}).",
                          "invalid_status", "status")
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
    record, _ = await overseen_batch(request, request.match_info["batch_id"])
    return web.json_response(record.batch.model_dump(mode="json"))


async def _listed(request: web.Request, scope: str) -> list[BatchRecord]:
    d, caller = deps(request), principal(request)
    if scope == "own":
        return await d.read_model.owner_batches(caller.owner)
    if scope not in ("organization", "all"):
        raise bad_request(f"scope must be 'own', 'organization' or 'all' (got {scope!r}).", "invalid_scope", "scope")
    if caller.role == "admin":
        everything = await d.read_model.list_batches()
        organization = request.query.get("organization_id")
        if scope == "all" or organization is None:
            return everything
        members = {owner_id(user.user_id, "") for user in await d.read_model.list_users()
                   if organization_of(user) == organization}
        return [record for record in everything if record.owner in members]
    admin = await administered_organization(d.read_model, caller)
    if scope == "all" or admin is None:
        raise ApiError(403, "Only an administrator of your organisation sees its members' batches (scope="
                            "organization), and only an admin key every batch (scope=all).", "permission_error",
                       "insufficient_permissions", "scope")
    return await members_batches(d.read_model, admin)


def _not_cancellable(batch_id: str, status: str) -> ApiError:
    return ApiError(400, f"Batch {batch_id} is {status} and can no longer be cancelled.", code="batch_not_cancellable")


async def cancel_batch(request: web.Request) -> web.Response:
    """Cancel: the answer to an accepted cancel is always `cancelling` (or later) with `cancelling_at` set; a batch
    past the point of no return (finalizing, or ended) is 400 `batch_not_cancellable`.

    The batch's log decides, not this read: the cancel is written only while no `finalizing` fact is in it (a
    fence checked with the write), and every finalizer reads the log back after its own `finalizing` fact, so a
    cancel that got in ends the batch `cancelled` (`BatchLog.outcome`)."""
    d = deps(request)
    record, by = await overseen_batch(request, request.match_info["batch_id"])
    await charge_control_call(request)
    batch = record.batch
    if batch.status not in CANCELLABLE and batch.status != "cancelling":
        raise _not_cancellable(batch.id, batch.status)
    if batch.status == "cancelling":
        return web.json_response(batch.model_dump(mode="json"))
    entry = await cancel_entry(d.read_model, principal(request), by)
    asked = BatchCancelRequested(aggregate_id=batch.id, requested_by_key_id=principal(request).key_id,
                                 by_admin=entry[0] if entry else None, by_admin_message=entry[1] if entry else None)
    try:
        await d.bus.publish(asked, fence=Fence(batch_fact(batch.id, "finalizing"), 0))
    except FenceMoved:  # the read model may not show `finalizing` yet; the log does
        raise _not_cancellable(batch.id, "finalizing") from None
    updated = await d.read_model.wait_for(lambda: d.read_model.get_batch(batch.id), _cancel_folded,
                                          d.settings.read_your_writes_s)
    if updated is None or not _cancel_folded(updated):
        # The ledger is behind; the cancel is in the log ahead of any finalizing fact, so it holds.
        batch = batch.model_copy(update={"status": "cancelling", "cancelling_at": asked.occurred_at // 1000})
    elif updated.batch.cancelling_at is None:
        # It had ended (expired, failed) before the cancel reached its log: the cancel changes nothing.
        raise _not_cancellable(batch.id, updated.batch.status)
    else:
        batch = updated.batch
    return web.json_response(batch.model_dump(mode="json"))


def _cancel_folded(record: BatchRecord) -> bool:
    """The ledger folded the cancel (`cancelling_at` set), or the batch had ended before it."""
    return record.batch.cancelling_at is not None or record.batch.status in TERMINAL


async def release_batch(request: web.Request) -> web.Response:
    """`POST /v1/batches/{id}/release` (extension): run a batch created with `hold` once it is validated."""
    d = deps(request)
    record = await owned_batch(request, request.match_info["batch_id"])
    await charge_control_call(request)
    batch = record.batch
    if not batch.held:
        raise bad_request(f"Batch {batch.id} is not held; only a batch created with hold=true waits for release.",
                          "batch_not_held")
    if batch.status not in RELEASABLE:
        raise bad_request(f"Batch {batch.id} is {batch.status} and cannot be released.", "batch_not_releasable")
    await d.bus.publish(BatchReleased(aggregate_id=batch.id, released_by_key_id=principal(request).key_id))
    updated = await d.read_model.wait_for(lambda: d.read_model.get_batch(batch.id), lambda r: not r.batch.held,
                                          d.settings.read_your_writes_s)
    batch = updated.batch if updated else batch.model_copy(update={"held": None})
    return web.json_response(batch.model_dump(mode="json"))
