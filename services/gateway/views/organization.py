"""Admin routes: users with their model access, API keys (raw value shown once), revocation, worker keys."""

import secrets
import time
from typing import TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from contracts.api.organization import ApiKey, CreateKey, CreateUser, CreateWorkerKey, DeletedApiKey, User
from contracts.api.page import ListPage
from contracts.events.key import KeyCreated, KeyRole, UserCreated
from contracts.ids import hash_api_key, new_api_key
from contracts.readmodel import ApiKeyRecord, UserRecord
from services.gateway.auth import KEY_CACHE, require_admin
from services.gateway.context import deps
from services.gateway.errors import ApiError, bad_request, not_found
from services.gateway.key_usage import KEY_USAGE
from services.gateway.revocation import find_key, revoke_key

MAX_BODY_BYTES = 64 * 1024
Body = TypeVar("Body", bound=BaseModel)


async def _body(request: web.Request, model: type[Body]) -> Body:
    raw = await request.content.read(MAX_BODY_BYTES + 1)
    if len(raw) > MAX_BODY_BYTES:
        raise ApiError(413, f"The request body is larger than {MAX_BODY_BYTES} bytes.", code="request_too_large")
    try:
        return model.model_validate_json(raw or b"{}")
    except ValidationError as error:
        first = error.errors()[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        raise bad_request(f"Invalid request: {first['msg']}.", "invalid_request", param) from None


def _user(record: UserRecord) -> User:
    return User(id=record.user_id, name=record.display_name, allowed_models=record.allowed_models,
                created_at=record.created_at)


async def _api_key(request: web.Request, record: ApiKeyRecord) -> ApiKey:
    usage = request.app.get(KEY_USAGE)
    last_ms = None if usage is None else await usage.last_used_ms(record.key_id)
    return ApiKey(id=record.key_id, name=record.label, role=record.role, user_id=record.user_id,
                  created_at=record.created_at, last_used_at=None if last_ms is None else last_ms // 1000,
                  revoked=record.revoked)


async def create_user(request: web.Request) -> web.Response:
    require_admin(request)
    d = deps(request)
    body = await _body(request, CreateUser)
    allowed = None
    if body.allowed_models is not None:
        allowed = []
        for name in body.allowed_models:
            model = d.catalogue.resolve(name)
            if model is None:
                raise bad_request(f"Model {name!r} is not in the catalogue; see GET /v1/models.",
                                  "unsupported_model", "allowed_models")
            allowed.append(model.id)
    user_id = body.id or f"user_{secrets.token_hex(8)}"
    if await d.read_model.get_user(user_id) is not None:
        raise ApiError(409, f"User {user_id} exists already.", "conflict_error", "user_exists", "id")
    await d.bus.publish(UserCreated(aggregate_id=user_id, display_name=body.name,
                                    allowed_models=sorted(set(allowed)) if allowed is not None else None))
    record = await d.read_model.wait_for(lambda: d.read_model.get_user(user_id), lambda r: True,
                                         d.settings.read_your_writes_s)
    if record is None:
        record = UserRecord(user_id=user_id, display_name=body.name, allowed_models=allowed,
                            created_at=int(time.time()))
    return web.json_response(_user(record).model_dump(mode="json"))


async def list_users(request: web.Request) -> web.Response:
    require_admin(request)
    users = sorted(await deps(request).read_model.list_users(), key=lambda u: (u.created_at, u.user_id))
    return web.json_response(ListPage[User](data=[_user(u) for u in users]).model_dump(mode="json"))


async def _create(request: web.Request, role: KeyRole, label: str, user_id: str | None) -> web.Response:
    d = deps(request)
    raw = new_api_key(worker=role == "worker")
    digest = hash_api_key(raw)
    await d.bus.publish(KeyCreated(aggregate_id=digest[:32], key_sha256=digest, role=role, label=label,
                                   user_id=user_id))
    record = await d.read_model.wait_for(lambda: d.read_model.get_api_key(digest), lambda r: True,
                                         d.settings.read_your_writes_s)
    if record is None:
        raise ApiError(503, "The key was created but is not readable yet; list keys in a moment.",
                       "server_error", "read_model_lagging")
    created = (await _api_key(request, record)).model_copy(update={"value": raw})
    return web.json_response(created.model_dump(mode="json"))


async def create_key(request: web.Request) -> web.Response:
    require_admin(request)
    body = await _body(request, CreateKey)
    if body.user_id is not None and await deps(request).read_model.get_user(body.user_id) is None:
        raise not_found("user", body.user_id)
    return await _create(request, body.role, body.name or f"{body.role} key", body.user_id)


async def _list(request: web.Request, workers: bool) -> web.Response:
    records = [r for _, r in await deps(request).read_model.list_api_keys() if (r.role == "worker") == workers]
    records.sort(key=lambda r: (r.created_at or 0, r.key_id))
    page = ListPage[ApiKey](data=[await _api_key(request, r) for r in records])
    return web.json_response(page.model_dump(mode="json"))


async def list_keys(request: web.Request) -> web.Response:
    require_admin(request)
    return await _list(request, workers=False)


async def _revoke(request: web.Request, workers: bool) -> web.Response:
    admin = require_admin(request)
    d = deps(request)
    key_id = request.match_info["key_id"]
    found = await find_key(d.read_model, key_id)
    if found is None or (found[1] == "worker") != workers:
        raise not_found("API key", key_id)
    digest = found[0]
    cancelled = await revoke_key(d.bus, d.read_model, digest, admin.key_id)
    request.app[KEY_CACHE].forget(f"apikey.{digest}")  # this gateway refuses it at once; others on their watch
    return web.json_response(DeletedApiKey(id=key_id, cancelled_batches=cancelled).model_dump(mode="json"))


async def revoke_api_key(request: web.Request) -> web.Response:
    return await _revoke(request, workers=False)


async def create_worker_key(request: web.Request) -> web.Response:
    require_admin(request)
    body = await _body(request, CreateWorkerKey)
    return await _create(request, "worker", body.name or "worker key", None)


async def list_worker_keys(request: web.Request) -> web.Response:
    require_admin(request)
    return await _list(request, workers=True)


async def revoke_worker_key(request: web.Request) -> web.Response:
    return await _revoke(request, workers=True)
