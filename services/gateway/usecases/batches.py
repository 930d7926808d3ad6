"""Batches: the rules of `POST /v1/batches` (and a retry's create), cancel and release that are not HTTP: which batch
a caller may see or act on, a create idempotent by key and deduplicated against a live twin, within the owner's
active-batch limit, billed when the deployment bills."""

import asyncio
import logging
import time
from dataclasses import dataclass

from contracts.api.batch import Batch
from contracts.api.batch_request import BatchCreateRequest
from contracts.billing import ModelPrice
from contracts.catalogue import CatalogueModel
from contracts.events.account import CreditsReleased
from contracts.events.batch import BatchCancelRequested, BatchCreated, BatchReleased
from contracts.events.file import FileUsed
from contracts.ids import derived_id, key_aggregate_id, new_batch_id
from contracts.lifecycle import CANCELLABLE, RELEASABLE, TERMINAL
from contracts.readmodel import ApiKeyRecord, BatchRecord, FileRecord, UserRecord
from contracts.subjects import batch_fact, file_fact, key_fact
from contracts.terms import BatchTerms
from services.gateway.adapters.admission import Holdings
from services.gateway.context import Deps
from services.gateway.usecases import billing as billing_usecase
from services.gateway.usecases.files import is_valid_id, owned_file
from services.gateway.usecases.oversight import Standing, cancel_entry, organization_of, standing
from services.gateway.usecases.refusals import ApiError, ascii_int, bad_request, not_found, revoked_key
from services.gateway.usecases.twin_claims import Claim, claim_or_twin, withdraw
from services.runtime.nats.bus import Fence, FenceMoved
from services.runtime.nats.facts import last_fact

log = logging.getLogger(__name__)

MAX_WINDOW_S = 168 * 3600
ACTIVE_BATCHES = "active_batches"

CreateParameters = tuple[str, str, str, dict[str, str] | None, bool, bool, int | None, str]
"""File, endpoint, window, metadata, allow_partial, hold, output_expires_after, placement."""


@dataclass(frozen=True)
class Created:
    """A create's answer: the batch, and the id of the earlier batch it is (a retry or a twin), if it is one."""

    batch: Batch
    same_as: str | None = None


async def owned_batch(d: Deps, caller: ApiKeyRecord, batch_id: str) -> BatchRecord:
    return (await overseen_batch(d, caller, batch_id, overseers=False))[0]


async def overseen_batch(d: Deps, caller: ApiKeyRecord, batch_id: str,
                         overseers: bool = True) -> tuple[BatchRecord, Standing]:
    """The batch, if the caller owns it or (with `overseers`) administers its owner; anyone else gets 404."""
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
    """`24h` (OpenAI's) up to `168h`; `m` and `s` units are for deployments that lower the minimum (expiry tests)."""
    units = {"h": 3600, "m": 60, "s": 1}
    amount = ascii_int(window[:-1], 9) if isinstance(window, str) and window[-1:] in units else None
    seconds = amount * units[str(window)[-1]] if amount is not None else 0
    if not min_window_s <= seconds <= MAX_WINDOW_S:
        raise bad_request(f"completion_window must be between '{min_window_s // 3600}h' and '168h' (got {window!r}).",
                          "invalid_completion_window", "completion_window")
    return seconds


async def _created_parameters(d: Deps, batch_id: str) -> CreateParameters | None:
    """What the batch was created with, read from its own `created` fact (the read model does not keep it all)."""
    found = await last_fact(d.bus, batch_fact(batch_id, "created"))
    if found is None or not isinstance(created := found[1], BatchCreated):
        return None
    return _parameters_of(created)


def _parameters_of(created: BatchCreated) -> CreateParameters:
    return (created.input_file_id, created.terms.endpoint, created.completion_window, created.metadata,
            created.allow_partial, created.hold, created.terms.output_expires_after_s, created.placement)


def _idempotency_conflict(key: str, batch_id: str) -> ApiError:
    return ApiError(409, f"Idempotency-Key {key!r} was used for batch {batch_id} with a different request body; "
                    "use a new key for a new batch.", "conflict_error", "idempotency_conflict", "Idempotency-Key")


@dataclass(frozen=True)
class _Terms:
    """What an admitted create settled: the caller's user, the default model, the account billed (None: not)."""

    user: UserRecord | None
    default_model: str | None
    billed_account: str | None


async def create_from(d: Deps, caller: ApiKeyRecord, key_digest: str, body: BatchCreateRequest,
                      idempotency_key: str | None) -> Created:
    """Create the batch `body` asks for (the create route's, and a retry's), as the key of SHA-256 `key_digest`. The
    batch is stated only while that key is not revoked (a fence on its revocation), so a create racing a revocation
    either comes first, and the revocation stops it, or is refused."""
    window_s = completion_window_seconds(body.completion_window, d.settings.min_completion_window_s)
    output_expires_after_s = body.output_expires_after.seconds if body.output_expires_after else None
    asked: CreateParameters = (body.input_file_id, body.endpoint, body.completion_window, body.metadata,
                               body.allow_partial, body.hold, output_expires_after_s, body.placement)
    batch_id = derived_id("batch_", caller.owner, idempotency_key) if idempotency_key else new_batch_id()
    if idempotency_key and (earlier := await _earlier(d, batch_id, idempotency_key, asked)) is not None:
        return Created(earlier, batch_id)
    file = await batch_input(d, caller, body.input_file_id)
    claim = None if idempotency_key else await claim_or_twin(d, caller.owner, asked, batch_id)
    if isinstance(claim, BatchCreated):  # the same create, sent at once, was stated first
        return await _twin_in_flight(d, caller.owner, claim)
    try:
        terms = await _admitted(d, caller, batch_id, body, file, None if idempotency_key else asked)
    except BaseException as refused:
        if claim is not None:  # not stated: a twin later must not wait for it
            await asyncio.shield(withdraw(d, claim))
        if isinstance(refused, _LiveTwin):
            return Created(refused.batch, refused.batch.id)
        raise
    event = _created_event(caller, batch_id, body, file, terms, window_s, output_expires_after_s)
    sequence = await _stated(d, event, Fence(key_fact(key_aggregate_id(caller.key_id, key_digest), "revoked"), 0),
                             terms, claim)
    if idempotency_key and await _created_parameters(d, batch_id) != asked:
        raise _idempotency_conflict(idempotency_key, batch_id)  # a concurrent request with this key won
    return Created(await _read_back(d, caller.owner, event, sequence))


async def _twin_in_flight(d: Deps, owner: str, twin: BatchCreated) -> Created:
    """The answer to a create whose twin, sent at once, was stated first: that batch."""
    stated = await d.read_model.get_batch(twin.aggregate_id)
    if stated is None:
        d.own_writes.note(owner, "batch", twin.aggregate_id)  # the owner's next read waits for it
    return Created(stated.batch if stated is not None else _as_created(twin), twin.aggregate_id)


async def _stated(d: Deps, event: BatchCreated, unrevoked: Fence, terms: _Terms, claim: Claim | None) -> int:
    """Publish the batch's `created` fact while its key is not revoked (`unrevoked`); its sequence. Failing, what the
    create holds is given back: the batch may not exist, so its reservation must not hold credit for ever, nor its
    claim make a twin wait."""
    try:
        return await d.bus.publish(event, fence=unrevoked)
    except BaseException as failed:
        if terms.billed_account is not None:
            await asyncio.shield(_release_quietly(d, terms.billed_account, event.aggregate_id))
        if claim is not None:
            await asyncio.shield(withdraw(d, claim))
        if isinstance(failed, FenceMoved):
            raise revoked_key() from None
        raise


async def _earlier(d: Deps, batch_id: str, idempotency_key: str, asked: CreateParameters) -> Batch | None:
    """The batch this key created already, if it asked for the same (else 409); None when there is none. Its
    `created` fact decides, not the read model: a retry later than the broker's two-minute dedup, while the ledger
    lags, would otherwise state the batch a second time."""
    found = await last_fact(d.bus, batch_fact(batch_id, "created"))
    if found is None or not isinstance(created := found[1], BatchCreated):
        return None
    if _parameters_of(created) != asked:
        raise _idempotency_conflict(idempotency_key, batch_id)
    earlier = await d.read_model.get_batch(batch_id)
    return earlier.batch if earlier is not None else _as_created(created)


async def batch_input(d: Deps, caller: ApiKeyRecord, input_file_id: str) -> FileRecord:
    """The caller's file a batch (or a quote) reads, if its purpose is `batch`."""
    file = await owned_file(d, caller, input_file_id)
    if file.file.purpose != "batch":
        raise bad_request(f"File {input_file_id} has purpose {file.file.purpose!r}; a batch needs purpose 'batch'.",
                          "invalid_input_file", "input_file_id")
    return file


class _LiveTwin(Exception):
    """The very same create while the first still runs (a client's blind retry): the first is the answer."""

    def __init__(self, batch: Batch) -> None:
        super().__init__(batch.id)
        self.batch = batch


async def _live_twin(d: Deps, owner: str, asked: CreateParameters, live: dict[str, str]) -> Batch | None:
    """The owner's live batch (of `live`) created with the very same parameters, if any. One being cancelled is no
    twin: a create after a cancel is a resubmission (its `cancel_requested` fact decides, the read model may lag)."""
    for record in await d.read_model.owner_live_batches(owner, asked[0], live):  # those reading the same file alone
        twin = record.batch
        if (twin.input_file_id, twin.endpoint, twin.completion_window) == asked[:3] and twin.status in CANCELLABLE \
                and await _created_parameters(d, twin.id) == asked \
                and await last_fact(d.bus, batch_fact(twin.id, BatchCancelRequested.name)) is None:
            return twin
    return None


async def _admitted(d: Deps, caller: ApiKeyRecord, batch_id: str, body: BatchCreateRequest, file: FileRecord,
                    twin_of: CreateParameters | None) -> _Terms:
    """Take an active-batch place, claim the file, reserve the worst case when billed; a refusal frees the place."""
    await _admit(d, caller.owner, batch_id, twin_of)
    try:
        user = await d.keys.user_of(caller)
        default_model = (body.metadata or {}).get("model") or file.model
        billing = _billing_plan(d, file, default_model, body.endpoint, body.metadata) if d.settings.billing else None
        try:  # unless the file was deleted meanwhile
            await d.bus.publish(FileUsed(aggregate_id=body.input_file_id, batch_id=batch_id),
                                fence=Fence(file_fact(body.input_file_id, "deleted"), 0))
        except FenceMoved:
            raise not_found("file", body.input_file_id) from None
        account = organization_of(user)
        if billing is not None:
            model, price, amount = billing
            await billing_usecase.reserve(d.bus, d.read_model, account, batch_id, amount, price, model.id,
                                          body.endpoint, d.settings.read_your_writes_s)
    except BaseException:  # refused before it was published: its place is free again
        await asyncio.shield(d.admission.release(ACTIVE_BATCHES, caller.owner, batch_id))
        raise
    return _Terms(user, default_model, account if billing is not None else None)


async def _admit(d: Deps, owner: str, batch_id: str, twin_of: CreateParameters | None) -> None:
    """Take one of the owner's active-batch places (atomically across gateways), else 429; a live twin of the
    create `twin_of` found on the way is raised (`_LiveTwin`), nothing taken."""

    async def held(listed: frozenset[str]) -> Holdings:  # the owner's live list, not their whole history
        # The records first, then the list: an admitted batch the read model shows is on the list read after
        # (or ended), so it is counted once, by the list or as still pending, never by neither.
        shown = await asyncio.gather(*(d.read_model.get_batch(batch_id) for batch_id in listed))
        live = await d.read_model.owner_live_list(owner)  # the create's one read of it
        if twin_of is not None and (twin := await _live_twin(d, owner, twin_of, live)) is not None:
            raise _LiveTwin(twin)
        return Holdings(dict.fromkeys(live, 1), frozenset(live).union(r.batch.id for r in shown if r is not None))

    limit = d.settings.max_active_batches
    used = await d.admission.take(ACTIVE_BATCHES, owner, batch_id, 1, limit, held)
    if used is not None:
        raise ApiError(429, f"You already have {used} batches that have not ended (the limit is {limit}); wait "
                       "for some to end or cancel them.", "rate_limit_error", "too_many_active_batches")


def _billing_plan(d: Deps, file: FileRecord, default_model: str | None, endpoint: str,
                  metadata: dict[str, str] | None) -> tuple[CatalogueModel, ModelPrice, int] | None:
    """The model, price and worst case a billed create reserves; None: no model known (validation fails it)."""
    model = billing_usecase.batch_model(d.catalogue, file, default_model)
    if model is None:
        return None
    price = billing_usecase.price_of(model)
    _, _, worst = billing_usecase.worst_case(model, price, billing_usecase.demand_of(file), endpoint)
    billing_usecase.check_max_price(worst, metadata)
    return model, price, worst


def _created_event(caller: ApiKeyRecord, batch_id: str, body: BatchCreateRequest, file: FileRecord, terms: _Terms,
                   window_s: int, output_expires_after_s: int | None) -> BatchCreated:
    now = int(time.time())
    user = terms.user
    return BatchCreated(
        aggregate_id=batch_id, terms=BatchTerms(
            owner_key_id=caller.key_id, endpoint=body.endpoint, input_object_key=file.object_key, created_at=now,
            expires_at=now + window_s, output_expires_after_s=output_expires_after_s),
        input_file_id=body.input_file_id, completion_window=body.completion_window, metadata=body.metadata,
        allow_partial=body.allow_partial, hold=body.hold, allowed_models=None if user is None else user.allowed_models,
        owner_user_id=caller.user_id, organization_id=None if user is None else user.organization_id,
        default_model=terms.default_model, billing_account=terms.billed_account, placement=body.placement)


async def _release_quietly(d: Deps, account: str, batch_id: str) -> None:
    if await d.read_model.get_batch(batch_id) is not None:
        return  # it was created after all: its end settles the reservation
    try:
        await d.bus.publish(CreditsReleased(aggregate_id=account, batch_id=batch_id,
                                            reason="the batch's creation failed"))
    except Exception:  # the broker is unreachable: the reservation stays until an operator releases it
        log.exception("could not release the reservation of batch %s", batch_id)


async def _read_back(d: Deps, owner: str, event: BatchCreated, sequence: int) -> Batch:
    """The batch as the create made it, `validating` (as OpenAI's create answers, even where validation already went
    on), once the read model shows it (else the owner's next list waits for it)."""
    batch_id = event.aggregate_id
    record = await d.folds.read_back(lambda: d.read_model.get_batch(batch_id), sequence, d.settings.read_your_writes_s)
    if record is None:
        d.own_writes.note(owner, "batch", batch_id)
        return _as_created(event)
    d.admission.shown(batch_id)
    if record.batch.status == "validating":
        return record.batch
    return _as_created(event).model_copy(update={"model": record.batch.model})


def _as_created(event: BatchCreated) -> Batch:
    """The batch as its `created` fact states it (what the read model shows once the ledger folds it)."""
    return Batch(id=event.aggregate_id, endpoint=event.terms.endpoint, input_file_id=event.input_file_id,
                 completion_window=event.completion_window, status="validating", created_at=event.terms.created_at,
                 expires_at=event.terms.expires_at, metadata=event.metadata, held=event.hold or None,
                 placement=event.placement)


def _not_cancellable(batch_id: str, status: str) -> ApiError:
    return ApiError(400, f"Batch {batch_id} is {status} and can no longer be cancelled.", code="batch_not_cancellable")


async def cancel(d: Deps, caller: ApiKeyRecord, record: BatchRecord, by: Standing) -> Batch:
    """An accepted cancel answers `cancelling` (or later) with `cancelling_at` set; past finalizing, 400. The log
    decides, not this read: the cancel is fenced on no `finalizing` fact, and every finalizer reads the log back after
    its own, so a cancel that got in ends the batch `cancelled` (`BatchLog.outcome`)."""
    batch = record.batch
    if batch.status == "cancelling":
        return batch
    if batch.status not in CANCELLABLE:
        raise _not_cancellable(batch.id, batch.status)
    entry = await cancel_entry(d.read_model, caller, by)
    asked = BatchCancelRequested(aggregate_id=batch.id, requested_by_key_id=caller.key_id,
                                 by_admin=entry[0] if entry else None, by_admin_message=entry[1] if entry else None)
    try:
        sequence = await d.bus.publish(asked, fence=Fence(batch_fact(batch.id, "finalizing"), 0))
    except FenceMoved:  # the read model may not show `finalizing` yet; the log does
        raise _not_cancellable(batch.id, "finalizing") from None
    updated = await d.folds.read_back(lambda: d.read_model.get_batch(batch.id), sequence,
                                      d.settings.read_your_writes_s, _cancel_folded)
    if updated is None or not _cancel_folded(updated):
        # The ledger is behind; the cancel is in the log ahead of any finalizing fact, so it holds.
        return batch.model_copy(update={"status": "cancelling", "cancelling_at": asked.occurred_at // 1000})
    if updated.batch.cancelling_at is None:
        # It had ended (expired, failed) before the cancel reached its log: the cancel changes nothing.
        raise _not_cancellable(batch.id, updated.batch.status)
    return updated.batch


def _cancel_folded(record: BatchRecord) -> bool:
    """The ledger folded the cancel (`cancelling_at` set), or the batch had ended before it."""
    return record.batch.cancelling_at is not None or record.batch.status in TERMINAL


async def release(d: Deps, caller: ApiKeyRecord, record: BatchRecord) -> Batch:
    batch = record.batch
    if not batch.held:
        raise bad_request(f"Batch {batch.id} is not held; only a batch created with hold=true waits for release.",
                          "batch_not_held")
    if batch.status not in RELEASABLE:
        raise bad_request(f"Batch {batch.id} is {batch.status} and cannot be released.", "batch_not_releasable")
    sequence = await d.bus.publish(BatchReleased(aggregate_id=batch.id, released_by_key_id=caller.key_id))
    updated = await d.folds.read_back(lambda: d.read_model.get_batch(batch.id), sequence, d.settings.read_your_writes_s,
                                      lambda r: not r.batch.held or r.batch.status in TERMINAL)
    if updated is not None and updated.batch.held and updated.batch.status in TERMINAL:
        # It ended between the check and the release, which the ledger then refused (a cancel's `cancelling` takes
        # the release still).
        raise bad_request(f"Batch {batch.id} is {updated.batch.status} and cannot be released.",
                          "batch_not_releasable")
    return updated.batch if updated and not updated.batch.held else batch.model_copy(update={"held": None})
