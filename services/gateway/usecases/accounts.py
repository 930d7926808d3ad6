"""Organisations, users and keys: the rules both `POST /v1/organization/…` and `sheshnag users|organizations|keys
create` follow (the catalogue check, the 409 for an id taken, the 404 for an organisation or user that is not)."""

import secrets
import time
from dataclasses import dataclass
from typing import Protocol

from contracts.api.organization import (
    DEFAULT_ORGANIZATION_ID,
    ApiKey,
    CreateKey,
    CreateOrganization,
    CreateUser,
    Organization,
    User,
)
from contracts.catalogue import Catalogue
from contracts.events.key import KeyCreated, KeyRole, UserCreated
from contracts.events.organization import OrganizationCreated
from contracts.ids import hash_api_key, new_api_key, new_key_id
from contracts.readmodel import ApiKeyRecord, OrganizationRecord, UserRecord
from services.gateway.usecases.refusals import ApiError, bad_request, not_found
from services.runtime.nats.bus import EventBus, Fence, FenceMoved
from services.runtime.nats.readmodel import ReadModel

DEFAULT_ORGANIZATION = Organization(id=DEFAULT_ORGANIZATION_ID, name="Default organization", created_at=0)


@dataclass(frozen=True)
class Accounts:
    """What the account use cases need: the log, the read model (writes read back within a while), the catalogue."""

    bus: EventBus
    read_model: ReadModel
    catalogue: Catalogue
    read_your_writes_s: float


class LastUse(Protocol):
    """Where the last use of each key is kept (`key_usage.KeyUsage`)."""

    async def last_used_ms(self, key_id: str) -> int | None: ...


def user_object(record: UserRecord) -> User:
    return User(id=record.user_id, name=record.display_name, allowed_models=record.allowed_models,
                created_at=record.created_at, organization_id=record.organization_id or DEFAULT_ORGANIZATION_ID,
                role=record.role)


def organization_object(record: OrganizationRecord) -> Organization:
    return Organization(id=record.organization_id, name=record.display_name, created_at=record.created_at)


async def api_key_object(record: ApiKeyRecord, usage: LastUse | None) -> ApiKey:
    """The key as the API shows it (never its value), with when it was last used if that is kept."""
    last_ms = None if usage is None else await usage.last_used_ms(record.key_id)
    return ApiKey(id=record.key_id, name=record.label, role=record.role, user_id=record.user_id,
                  created_at=record.created_at, provider_id=record.provider_id,
                  last_used_at=None if last_ms is None else last_ms // 1000, revoked=record.revoked)


def _catalogue_ids(accounts: Accounts, names: list[str] | None) -> list[str] | None:
    """The catalogue ids the names (ids or aliases) stand for; null stays null: every model."""
    if names is None:
        return None
    allowed = set()
    for name in names:
        model = accounts.catalogue.resolve(name)
        if model is None:
            raise bad_request(f"Model {name!r} is not in the catalogue; see GET /v1/models.", "unsupported_model",
                              "allowed_models")
        allowed.add(model.id)
    return sorted(allowed)


async def create_user(accounts: Accounts, body: CreateUser) -> User:
    allowed = _catalogue_ids(accounts, body.allowed_models)
    user_id = body.id or f"user_{secrets.token_hex(8)}"
    if await accounts.read_model.get_user(user_id) is not None:
        raise ApiError(409, f"User {user_id} exists already.", "conflict_error", "user_exists", "id")
    organization_id = None if body.organization_id == DEFAULT_ORGANIZATION_ID else body.organization_id
    if organization_id is not None and await accounts.read_model.get_organization(organization_id) is None:
        raise not_found("organization", organization_id)
    created = UserCreated(aggregate_id=user_id, display_name=body.name, allowed_models=allowed,
                          organization_id=organization_id, role=body.role)
    await _create_once(accounts.bus, created, ApiError(409, f"User {user_id} exists already.", "conflict_error",
                                                       "user_exists", "id"))
    record = await accounts.read_model.wait_for(lambda: accounts.read_model.get_user(user_id), lambda r: True,
                                                accounts.read_your_writes_s)
    if record is None:
        record = UserRecord(user_id=user_id, display_name=body.name, allowed_models=allowed,
                            created_at=int(time.time()), organization_id=organization_id, role=body.role)
    return user_object(record)


async def create_organization(accounts: Accounts, body: CreateOrganization) -> Organization:
    organization_id = body.id or f"org_{secrets.token_hex(8)}"
    if organization_id == DEFAULT_ORGANIZATION_ID or await accounts.read_model.get_organization(organization_id):
        raise ApiError(409, f"Organization {organization_id} exists already.", "conflict_error",
                       "organization_exists", "id")
    await _create_once(accounts.bus, OrganizationCreated(aggregate_id=organization_id, display_name=body.name),
                       ApiError(409, f"Organization {organization_id} exists already.", "conflict_error",
                                "organization_exists", "id"))
    record = await accounts.read_model.wait_for(lambda: accounts.read_model.get_organization(organization_id),
                                                lambda r: True, accounts.read_your_writes_s)
    if record is None:
        return Organization(id=organization_id, name=body.name, created_at=int(time.time()))
    return organization_object(record)


async def _create_once(bus: EventBus, created: UserCreated | OrganizationCreated, exists: ApiError) -> None:
    """Publish the creation unless its subject holds one already (then `exists`): the read model's check before is
    only the quick answer, and two creates of one id racing past it make one fact, the other a 409 (the broker checks
    the fence before its dedup, so the second is refused, not taken for a repeat of the first)."""
    try:
        await bus.publish(created, fence=Fence(created.subject, 0))
    except FenceMoved:
        raise exists from None


async def create_key(accounts: Accounts, role: KeyRole, label: str, user_id: str | None = None,
                     provider_id: str | None = None, key_id: str | None = None) -> tuple[str, ApiKeyRecord]:
    """A new key (`key_id`, else a new id) and its record; the raw value is here only (the log keeps its SHA-256)."""
    raw = new_api_key(worker=role == "worker")
    digest, key_id = hash_api_key(raw), key_id or new_key_id()
    await accounts.bus.publish(KeyCreated(aggregate_id=key_id, key_id=key_id, key_sha256=digest, role=role,
                                          label=label, user_id=user_id, provider_id=provider_id))
    record = await accounts.read_model.wait_for(lambda: accounts.read_model.get_api_key(digest), lambda r: True,
                                                accounts.read_your_writes_s)
    if record is None:
        raise ApiError(503, "The key was created but is not readable yet; list keys in a moment.",
                       "server_error", "read_model_lagging")
    return raw, record


async def create_user_key(accounts: Accounts, body: CreateKey, key_id: str | None = None) -> tuple[str, ApiKeyRecord]:
    """An admin or user key, for a user that exists."""
    if body.user_id is not None and await accounts.read_model.get_user(body.user_id) is None:
        raise not_found("user", body.user_id)
    return await create_key(accounts, body.role, body.name or f"{body.role} key", body.user_id, key_id=key_id)
