"""Admin routes: organisations, users with their model access, API keys (raw value shown once), revocation,
worker keys."""

import re
import secrets
import time
from typing import TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from contracts.api.organization import (
    DEFAULT_ORGANIZATION_ID,
    USER_ID_PATTERN,
    ApiKey,
    CreateKey,
    CreateOrganization,
    CreateUser,
    CreateWorkerKey,
    DeletedApiKey,
    Organization,
    User,
)
from contracts.api.page import ListPage
from contracts.events.key import KeyCreated, KeyRole, UserCreated
from contracts.events.organization import OrganizationCreated
from contracts.ids import hash_api_key, new_api_key
from contracts.readmodel import ApiKeyRecord, OrganizationRecord, UserRecord
from services.gateway.auth import KEY_CACHE, require_admin
from services.gateway.context import deps
from services.gateway.errors import ApiError, bad_request, not_found
from services.gateway.key_usage import KEY_USAGE
from services.gateway.revocation import find_key, revoke_key

MAX_BODY_BYTES = 64 * 1024
Body = TypeVar("Body", bound=BaseModel)


async def read_body(request: web.Request, model: type[Body]) -> Body:
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
                created_at=record.created_at, organization_id=record.organization_id or DEFAULT_ORGANIZATION_ID)


async def api_key_object(request: web.Request, record: ApiKeyRecord) -> ApiKey:
    usage = request.app.get(KEY_USAGE)
    last_ms = None if usage is None else await usage.last_used_ms(record.key_id)
    return ApiKey(id=record.key_id, name=record.label, role=record.role, user_id=record.user_id,
                  created_at=record.created_at, provider_id=record.provider_id,
                  last_used_at=None if last_ms is None else last_ms // 1000, revoked=record.revoked)


async def create_user(request: web.Request) -> web.Response:
    require_admin(request)
    d = deps(request)
    body = await read_body(request, CreateUser)
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
    organization_id = None if body.organization_id == DEFAULT_ORGANIZATION_ID else body.organization_id
    if organization_id is not None and await d.read_model.get_organization(organization_id) is None:
        raise not_found("organization", organization_id)
    await d.bus.publish(UserCreated(aggregate_id=user_id, display_name=body.name,
                                    allowed_models=sorted(set(allowed)) if allowed is not None else None,
                                    organization_id=organization_id))
    record = await d.read_model.wait_for(lambda: d.read_model.get_user(user_id), lambda r: True,
                                         d.settings.read_your_writes_s)
    if record is None:
        record = UserRecord(user_id=user_id, display_name=body.name, allowed_models=allowed,
                            created_at=int(time.time()), organization_id=organization_id)
    return web.json_response(_user(record).model_dump(mode="json"))


async def list_users(request: web.Request) -> web.Response:
    """Every user, or with `?organization_id=` the members of one organisation."""
    require_admin(request)
    users = sorted(await deps(request).read_model.list_users(), key=lambda u: (u.created_at, u.user_id))
    shown = [_user(u) for u in users]
    if (organization_id := request.query.get("organization_id")) is not None:
        shown = [u for u in shown if u.organization_id == organization_id]
    return web.json_response(ListPage[User](data=shown).model_dump(mode="json"))


DEFAULT_ORGANIZATION = Organization(id=DEFAULT_ORGANIZATION_ID, name="Default organization", created_at=0)


def _organization(record: OrganizationRecord) -> Organization:
    return Organization(id=record.organization_id, name=record.display_name, created_at=record.created_at)


async def create_organization(request: web.Request) -> web.Response:
    require_admin(request)
    d = deps(request)
    body = await read_body(request, CreateOrganization)
    organization_id = body.id or f"org_{secrets.token_hex(8)}"
    if organization_id == DEFAULT_ORGANIZATION_ID or await d.read_model.get_organization(organization_id):
        raise ApiError(409, f"Organization {organization_id} exists already.", "conflict_error",
                       "organization_exists", "id")
    await d.bus.publish(OrganizationCreated(aggregate_id=organization_id, display_name=body.name))
    record = await d.read_model.wait_for(lambda: d.read_model.get_organization(organization_id), lambda r: True,
                                         d.settings.read_your_writes_s)
    created = Organization(id=organization_id, name=body.name, created_at=int(time.time())) if record is None \
        else _organization(record)
    return web.json_response(created.model_dump(mode="json"))


async def list_organizations(request: web.Request) -> web.Response:
    """The default organisation first, then every created one, oldest first."""
    require_admin(request)
    records = sorted(await deps(request).read_model.list_organizations(),
                     key=lambda o: (o.created_at, o.organization_id))
    page = ListPage[Organization](data=[DEFAULT_ORGANIZATION, *map(_organization, records)])
    return web.json_response(page.model_dump(mode="json"))


async def retrieve_organization(request: web.Request) -> web.Response:
    require_admin(request)
    organization_id = request.match_info["organization_id"]
    if organization_id == DEFAULT_ORGANIZATION_ID:
        return web.json_response(DEFAULT_ORGANIZATION.model_dump(mode="json"))
    valid = re.fullmatch(USER_ID_PATTERN, organization_id) is not None  # `&` or `a.b` name no KV key
    record = await deps(request).read_model.get_organization(organization_id) if valid else None
    if record is None:
        raise not_found("organization", organization_id)
    return web.json_response(_organization(record).model_dump(mode="json"))


async def create_key_for(request: web.Request, role: KeyRole, label: str, user_id: str | None,
                  provider_id: str | None = None) -> web.Response:
    d = deps(request)
    raw = new_api_key(worker=role == "worker")
    digest = hash_api_key(raw)
    await d.bus.publish(KeyCreated(aggregate_id=digest[:32], key_sha256=digest, role=role, label=label,
                                   user_id=user_id, provider_id=provider_id))
    record = await d.read_model.wait_for(lambda: d.read_model.get_api_key(digest), lambda r: True,
                                         d.settings.read_your_writes_s)
    if record is None:
        raise ApiError(503, "The key was created but is not readable yet; list keys in a moment.",
                       "server_error", "read_model_lagging")
    created = (await api_key_object(request, record)).model_copy(update={"value": raw})
    return web.json_response(created.model_dump(mode="json"))


async def create_key(request: web.Request) -> web.Response:
    require_admin(request)
    body = await read_body(request, CreateKey)
    if body.user_id is not None and await deps(request).read_model.get_user(body.user_id) is None:
        raise not_found("user", body.user_id)
    return await create_key_for(request, body.role, body.name or f"{body.role} key", body.user_id)


async def _list(request: web.Request, workers: bool) -> web.Response:
    records = [r for _, r in await deps(request).read_model.list_api_keys() if (r.role == "worker") == workers]
    records.sort(key=lambda r: (r.created_at or 0, r.key_id))
    page = ListPage[ApiKey](data=[await api_key_object(request, r) for r in records])
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
    body = await read_body(request, CreateWorkerKey)
    return await create_key_for(request, "worker", body.name or "worker key", None)


async def list_worker_keys(request: web.Request) -> web.Response:
    require_admin(request)
    return await _list(request, workers=True)


async def revoke_worker_key(request: web.Request) -> web.Response:
    return await _revoke(request, workers=True)
