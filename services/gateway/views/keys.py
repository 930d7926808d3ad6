"""Key routes: API keys (raw value shown once) and their revocation, worker keys (an admin's, a provider's own); a
user key manages its own user's keys through the same routes, and no other. Rules: `usecases.accounts`."""

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial

from aiohttp import web

from contracts.api.organization import ApiKey, CreateKey, CreateWorkerKey, DeletedApiKey, Me
from contracts.api.page import ListPage
from contracts.ids import new_key_id
from contracts.readmodel import ApiKeyRecord, provider_holder, user_holder
from services.gateway.adapters.admission import Holdings
from services.gateway.background.key_usage import KEY_USAGE
from services.gateway.context import accounts, deps
from services.gateway.http.auth import principal
from services.gateway.http.bodies import answer, read_body
from services.gateway.http.limits import charge_control_call
from services.gateway.usecases import accounts as usecases
from services.gateway.usecases.oversight import managed_provider, organization_of
from services.gateway.usecases.refusals import ApiError, not_found
from services.gateway.usecases.revocation import find_key, revoke

KEYS = "keys"
USAGE_READS_AT_ONCE = 64
"""Keys whose last use is read at once while a list of keys is answered (a read each, not one after another)."""


async def key_answer(request: web.Request, raw: str, record: ApiKeyRecord) -> web.Response:
    """A key just created: its object, with the raw value this once."""
    return answer((await usecases.api_key_object(record, request.app.get(KEY_USAGE))).model_copy(update={"value": raw}))


def own_keys_user(request: web.Request) -> str:
    """The user whose own keys a user key manages (Dashboard → API Keys); a key of no user manages none."""
    caller = principal(request)
    if caller.user_id is None:
        raise ApiError(403, "This key belongs to no user, so it has no keys of its own to manage; an admin key "
                            "manages every key.", "permission_error", "insufficient_permissions")
    return caller.user_id


async def create_key(request: web.Request) -> web.Response:
    """An admin creates any user's or admin key; a user creates a key of their own (same user, role `user`)."""
    body = await read_body(request, CreateKey)
    if principal(request).role != "admin":
        user_id = own_keys_user(request)
        if body.role != "user":
            raise ApiError(403, "Only an admin key may create admin keys.", "permission_error",
                           "insufficient_permissions", "role")
        if body.user_id not in (None, user_id):
            raise ApiError(403, "A user creates keys for themselves only; leave user_id out or name your own.",
                           "permission_error", "insufficient_permissions", "user_id")
        body = body.model_copy(update={"user_id": user_id})
        await charge_control_call(request)  # a user's own keys: made at a control call's pace
    key_id = new_key_id()
    if body.user_id is not None:
        if await deps(request).read_model.get_user(body.user_id) is None:
            raise not_found("user", body.user_id)
        await _admit_key(request, body.user_id, key_id)
    return await key_answer(request, *await usecases.create_user_key(accounts(request), body, key_id))


async def _admit_key(request: web.Request, user_id: str, key_id: str) -> None:
    """Take one of the user's key places for `key_id` (atomically across gateways), else 429."""
    d = deps(request)

    async def mine() -> list[ApiKeyRecord]:
        return [r for _, r in await d.read_model.held_api_keys(user_holder(user_id)) if r.user_id == user_id]

    await _take_key_place(request, f"user-{user_id}", key_id, mine, d.settings.max_keys_per_user,
                          f"User {user_id}", "keys")


async def _take_key_place(request: web.Request, owner: str, key_id: str,
                          keys: Callable[[], Awaitable[list[ApiKeyRecord]]], limit: int, whose: str, what: str,
                          ) -> None:
    """Take one of `owner`'s places for `key_id` among its keys not revoked (`keys`: all of them, revoked ones stay
    in the read model), atomically across gateways; else 429 `too_many_keys` (`whose` `what`: the message's words)."""

    async def held(_: frozenset[str]) -> Holdings:
        records = await keys()
        return Holdings({r.key_id: 1 for r in records if not r.revoked}, frozenset(r.key_id for r in records))

    used = await deps(request).admission.take(KEYS, owner, key_id, 1, limit, held)
    if used is not None:
        raise ApiError(429, f"{whose} already has {used} {what} that are not revoked (the limit is {limit}); revoke "
                       "some first.", "rate_limit_error", "too_many_keys")


async def _list(request: web.Request, workers: bool) -> web.Response:
    """An admin sees every key of the kind; a user their own keys (read from their own, never every key)."""
    read_model = deps(request).read_model
    if principal(request).role == "admin":
        records = [r for _, r in await read_model.list_api_keys() if (r.role == "worker") == workers]
    else:
        user_id = own_keys_user(request)
        records = [r for _, r in await read_model.held_api_keys(user_holder(user_id))
                   if r.user_id == user_id and r.role == "user" and not workers]
    return await keys_page(request, records)


async def keys_page(request: web.Request, records: list[ApiKeyRecord]) -> web.Response:
    usage = request.app.get(KEY_USAGE)
    ordered = sorted(records, key=lambda r: (r.created_at or 0, r.key_id))
    keys: list[ApiKey] = []
    for start in range(0, len(ordered), USAGE_READS_AT_ONCE):
        part = ordered[start:start + USAGE_READS_AT_ONCE]
        keys += await asyncio.gather(*(usecases.api_key_object(record, usage) for record in part))
    return answer(ListPage[ApiKey](data=keys))


async def who_am_i(request: web.Request) -> web.Response:
    caller = principal(request)
    user = await deps(request).keys.user_of(caller)
    return answer(Me(key_id=caller.key_id, role=caller.role, user_id=caller.user_id,
                     organization_id=organization_of(user), organization_role=user.role if user else None))


async def _revoke(request: web.Request, workers: bool) -> web.Response:
    own_user = own_keys_user(request) if principal(request).role != "admin" else None
    key_id = request.match_info["key_id"]  # never paced: whoever spends the budget must not keep a key from its end
    found = await find_key(deps(request).read_model, key_id, everywhere=own_user is None)
    # Another user's key is not there, as far as a user can tell.
    if found is None or (found[1].role == "worker") != workers or (
            own_user is not None and (found[1].role != "user" or found[1].user_id != own_user)):
        raise not_found("API key", key_id)
    return await revoked(request, found[0], key_id)


async def revoked(request: web.Request, digest: str, key_id: str) -> web.Response:
    """Revoke the key (`key_id`, `digest`) for the caller: its live batches stop. Answered once the read model
    holds the revocation (or after `read_your_writes_s`), so the caller's next list shows it."""
    d = deps(request)

    async def folded(sequence: int) -> None:
        await d.folds.read_back(lambda: d.read_model.get_api_key(digest), sequence, d.settings.read_your_writes_s,
                                lambda record: record.revoked)

    _, cancelled = await revoke(d.bus, d.read_model, digest, principal(request).key_id, folded)
    d.keys.forget(f"apikey.{digest}")  # this gateway refuses it at once; others on their watch
    return answer(DeletedApiKey(id=key_id, cancelled_batches=cancelled))


async def create_worker_key(request: web.Request, provider_id: str | None = None) -> web.Response:
    body = await read_body(request, CreateWorkerKey)
    return await key_answer(request, *await usecases.create_key(accounts(request), "worker", body.name or "worker key",
                                                                None, provider_id))


list_keys = partial(_list, workers=False)
list_worker_keys = partial(_list, workers=True)
revoke_api_key = partial(_revoke, workers=False)
revoke_worker_key = partial(_revoke, workers=True)


async def _charge_unless_admin(request: web.Request) -> None:
    """A tenant's keys are made at a control call's pace (an admin's are not counted; a revocation never is)."""
    if principal(request).role != "admin":
        await charge_control_call(request)


async def _worker_keys(request: web.Request, provider_id: str) -> list[tuple[str, ApiKeyRecord]]:
    return [(digest, r) for digest, r in await deps(request).read_model.held_api_keys(provider_holder(provider_id))
            if r.role == "worker" and r.provider_id == provider_id]


async def create_provider_worker_key(request: web.Request) -> web.Response:
    d = deps(request)
    provider = await managed_provider(d.read_model, principal(request), request.match_info["provider_id"])
    body = await read_body(request, CreateWorkerKey)
    await _charge_unless_admin(request)
    key_id = new_key_id()

    async def providers_keys() -> list[ApiKeyRecord]:
        return [r for _, r in await _worker_keys(request, provider.provider_id)]

    await _take_key_place(request, provider.provider_id, key_id, providers_keys,
                          d.settings.max_worker_keys_per_provider, f"Provider {provider.provider_id}", "worker keys")
    return await key_answer(request, *await usecases.create_key(accounts(request), "worker", body.name or "worker key",
                                                                None, provider.provider_id, key_id))


async def list_provider_worker_keys(request: web.Request) -> web.Response:
    provider = await managed_provider(deps(request).read_model, principal(request), request.match_info["provider_id"])
    return await keys_page(request, [r for _, r in await _worker_keys(request, provider.provider_id)])


async def revoke_provider_worker_key(request: web.Request) -> web.Response:
    provider = await managed_provider(deps(request).read_model, principal(request), request.match_info["provider_id"])
    key_id = request.match_info["key_id"]
    found = [digest for digest, r in await _worker_keys(request, provider.provider_id) if r.key_id == key_id]
    if not found:
        raise not_found("worker key", key_id)
    return await revoked(request, found[0], key_id)
