"""Provider portal: a signed-in user registers a provider (its worker keys: `keys.py`) and sees its executors with the
lines they served; admins see every provider and executor, and approve providers (a platform admin for every
organisation, an organisation's administrator for their own)."""

import secrets
import time
from functools import partial

from aiohttp import web

from contracts.api.organization import DEFAULT_ORGANIZATION_ID
from contracts.api.page import ListPage
from contracts.api.provider import ApproveProvider, ExecutorMemory, Provider, ProviderExecutor, RegisterProvider
from contracts.events.executor import ExecutorAdvert
from contracts.events.provider import ProviderApprovalWithdrawn, ProviderApproved, ProviderRegistered
from contracts.readmodel import ExecutorRecord, ProviderRecord, provider_holder
from services.gateway.adapters.admission import Holdings
from services.gateway.context import deps
from services.gateway.http.auth import principal
from services.gateway.http.bodies import answer, read_body
from services.gateway.usecases.files import is_valid_id
from services.gateway.usecases.oversight import (
    administered_organization,
    existing_organization,
    managed_provider,
    organization_of,
    owns,
)
from services.gateway.usecases.refusals import ApiError, not_found
from services.runtime.nats.readmodel import ReadModel


async def _provider_object(request: web.Request, record: ProviderRecord) -> Provider:
    owner = await deps(request).read_model.get_user(record.owner_user_id) if record.owner_user_id else None
    return Provider(id=record.provider_id, name=record.display_name, owner_user_id=record.owner_user_id,
                    created_at=record.created_at, organization_id=organization_of(owner),
                    status="approved" if record.approved_platform_wide else "unapproved",
                    approved_organizations=record.approved_organizations)


PROVIDERS = "providers"


async def _admit_provider(request: web.Request, provider_id: str) -> None:
    """Take one of the caller's provider places for `provider_id` (atomically across gateways), else 429."""
    d, me = deps(request), principal(request)

    async def held(_: frozenset[str]) -> Holdings:  # a provider is never deleted: each counts for good
        mine = frozenset(r.provider_id for r in await d.read_model.owner_providers(me.owner))
        return Holdings(dict.fromkeys(mine, 1), mine)

    limit = d.settings.max_providers_per_user
    used = await d.admission.take(PROVIDERS, me.owner, provider_id, 1, limit, held)
    if used is not None:
        raise ApiError(429, f"You already registered {used} providers (the limit is {limit}); add worker keys to one "
                       "of them for more executor hosts.", "rate_limit_error", "too_many_providers")


async def register_provider(request: web.Request) -> web.Response:
    d, me = deps(request), principal(request)
    body = await read_body(request, RegisterProvider)
    provider_id = f"prov_{secrets.token_hex(8)}"
    await _admit_provider(request, provider_id)  # a publish that fails holds its place for the grace (it may be in)
    await d.bus.publish(ProviderRegistered(aggregate_id=provider_id, display_name=body.name,
                                           owner_key_id=me.key_id, owner_user_id=me.user_id))
    record = await d.read_model.wait_for(lambda: d.read_model.get_provider(provider_id), lambda r: True,
                                         d.settings.read_your_writes_s)
    if record is None:
        record = ProviderRecord(provider_id=provider_id, display_name=body.name, owner_key_id=me.key_id,
                                owner_user_id=me.user_id, created_at=int(time.time()))
    return answer(await _provider_object(request, record))


async def list_providers(request: web.Request) -> web.Response:
    me = principal(request)
    read_model = deps(request).read_model
    listed = await read_model.list_providers() if me.role == "admin" else await read_model.owner_providers(me.owner)
    mine = sorted((r for r in listed if owns(me, r)), key=lambda r: (r.created_at, r.provider_id))
    return answer(ListPage[Provider](data=[await _provider_object(request, r) for r in mine]))


async def retrieve_provider(request: web.Request) -> web.Response:
    record = await managed_provider(deps(request).read_model, principal(request), request.match_info["provider_id"])
    return answer(await _provider_object(request, record))


async def _approval_scope(request: web.Request) -> str | None:
    """The scope the caller approves in (None: the platform): an admin any, an organisation's administrator its own."""
    me = principal(request)
    body = await read_body(request, ApproveProvider)
    if me.role == "admin":
        if body.organization_id is None:
            return None
        return await existing_organization(deps(request).read_model, body.organization_id)
    admin = await administered_organization(deps(request).read_model, me)
    if admin is None:
        raise ApiError(403, "Only a platform admin, or an administrator of an organisation (for that organisation), "
                       "may approve providers.", "permission_error", "insufficient_permissions")
    own = organization_of(admin)
    if own == DEFAULT_ORGANIZATION_ID:
        raise ApiError(403, "The default organisation holds every user made without one: only a platform admin "
                       "approves providers there.", "permission_error", "insufficient_permissions")
    if body.organization_id not in (None, own):
        raise ApiError(403, f"An administrator of organization {own} approves providers for {own} only.",
                       "permission_error", "insufficient_permissions", "organization_id")
    return own


async def _set_approval(request: web.Request, approved: bool) -> web.Response:
    """Approve (or withdraw) a provider in the caller's scope: 403 for anyone who approves in none, 404 for no such
    provider. What its executors run of batches no longer allowed to them is fenced, and runs elsewhere."""
    d, me = deps(request), principal(request)
    scope = await _approval_scope(request)
    provider_id = request.match_info["provider_id"]
    record = await d.read_model.get_provider(provider_id) if is_valid_id(provider_id) else None
    if record is None:
        raise not_found("provider", provider_id)
    fact = (ProviderApproved(aggregate_id=provider_id, organization_id=scope, approved_by_key_id=me.key_id)
            if approved else
            ProviderApprovalWithdrawn(aggregate_id=provider_id, organization_id=scope, withdrawn_by_key_id=me.key_id))
    await d.bus.publish(fact)

    def settled(r: ProviderRecord | None) -> bool:
        held = r is not None and (r.approved_platform_wide if scope is None else scope in r.approved_organizations)
        return held == approved

    seen = await d.read_model.wait_for(lambda: d.read_model.get_provider(provider_id), settled,
                                       d.settings.read_your_writes_s)
    if seen is None or not settled(seen):  # the ledger lags: answer with what the fact makes of it
        seen = _with_approval(record, scope, approved)
    if not owns(me, seen):
        # An organisation's administrator approves another's provider for their own organisation: they are shown
        # their own approval, never which other organisations approved it.
        seen = seen.model_copy(update={"approved_organizations": [o for o in seen.approved_organizations
                                                                  if o == scope]})
    return answer(await _provider_object(request, seen))


def _with_approval(record: ProviderRecord, scope: str | None, approved: bool) -> ProviderRecord:
    if scope is None:
        return record.model_copy(update={"approved_platform_wide": approved})
    others = [org for org in record.approved_organizations if org != scope]
    return record.model_copy(update={"approved_organizations": sorted([*others, scope] if approved else others)})


approve_provider = partial(_set_approval, approved=True)
unapprove_provider = partial(_set_approval, approved=False)


def _age_s(at_ms: int | None, now_ms: int) -> float | None:
    return None if at_ms is None else round(max(now_ms - at_ms, 0) / 1000, 1)


def _executor(executor_id: str, record: ExecutorRecord | None, advert: ExecutorAdvert | None,
              provider_id: str | None, now_ms: int) -> ProviderExecutor:
    """What the log says (worker key, lines served) joined with its live heartbeat, when it still sends one."""
    fields: dict[str, object] = {"id": executor_id, "provider_id": provider_id,
                                 "worker_key_id": record.worker_key_id if record is not None else None,
                                 "lines_served": record.lines_served if record is not None else 0}
    if advert is not None:
        memory = ExecutorMemory(free_bytes=sum(d.free_bytes for d in advert.devices),
                                total_bytes=sum(d.total_bytes for d in advert.devices))
        fields |= {"engine": advert.engine, "engine_version": advert.engine_version, "models": advert.models,
                   "loaded_models": advert.loaded_models, "memory": memory, "slots": advert.slots,
                   "health": "live", "heartbeat_age_s": _age_s(advert.heartbeat_at, now_ms)}
    elif record is not None:
        fields |= {"engine": record.engine, "engine_version": record.engine_version, "models": record.models,
                   "loaded_models": [], "memory": None, "slots": None, "health": "lost",
                   "heartbeat_age_s": _age_s(record.last_heartbeat_at, now_ms)}
    return ProviderExecutor.model_validate(fields)


async def list_executors(request: web.Request) -> web.Response:
    """Executors that joined with a worker key of a provider the caller manages (admins: every executor);
    `?provider_id=` narrows the list to one provider (404 when it is not the caller's). A caller's list reads only
    their providers' executors, never every executor."""
    d, me = deps(request), principal(request)
    wanted = request.query.get("provider_id")
    everyone = me.role == "admin" and wanted is None
    if wanted is not None:
        providers = {(await managed_provider(d.read_model, me, wanted)).provider_id}
    elif me.role == "admin":
        providers = set()
    else:
        providers = {r.provider_id for r in await d.read_model.owner_providers(me.owner)}
    filed = None if everyone else {p: await d.read_model.provider_executors(p) for p in sorted(providers)}
    if filed is not None and None not in filed.values():
        records = {r.executor_id: r for found in filed.values() if found is not None for r in found}
        owner_of: dict[str, str | None] = {r.executor_id: provider_id for provider_id, found in filed.items()
                                           if found is not None for r in found}
    else:  # every executor (an admin's whole list, or a read model whose executors are not filed yet)
        records, owner_of = await _every_executor(d.read_model, everyone, providers)
    adverts = {a.executor_id: a for a in await d.fleet.adverts() if everyone or a.executor_id in records}
    now_ms = int(time.time() * 1000)
    shown = []
    for executor_id in sorted(records.keys() | adverts.keys()):
        provider_id = owner_of.get(executor_id)
        if everyone or (provider_id is not None and provider_id in providers):
            shown.append(_executor(executor_id, records.get(executor_id), adverts.get(executor_id), provider_id,
                                   now_ms))
    return answer(ListPage[ProviderExecutor](data=shown))


async def _every_executor(read_model: ReadModel, everyone: bool, providers: set[str]
                          ) -> tuple[dict[str, ExecutorRecord], dict[str, str | None]]:
    """Every executor record, and each one's provider by its worker key (every key's for `everyone`, else only the
    keys of `providers`)."""
    workers = await read_model.list_api_keys() if everyone else [
        held for provider_id in sorted(providers) for held in await read_model.held_api_keys(
            provider_holder(provider_id))]
    key_providers = {r.key_id: r.provider_id for _, r in workers if r.role == "worker"}
    records = {r.executor_id: r for r in await read_model.list_executors()}
    return records, {executor_id: key_providers.get(record.worker_key_id) if record.worker_key_id else None
                     for executor_id, record in records.items()}
