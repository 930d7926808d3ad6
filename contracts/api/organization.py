"""Users and API keys as the admin routes (`/v1/organization/…`, `/v1/provider/worker_keys`) and providers' owners
(`/v1/provider/providers/{id}/worker_keys`) see them."""

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from contracts.api.field_errors import refused_as
from contracts.events.key import MemberRole

USER_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
"""Ids become part of NATS subjects: no dots, spaces or wildcards."""
ChosenId = Annotated[str | None, Field(pattern=USER_ID_PATTERN), refused_as(
    "invalid_id", "An id is 1-64 letters, digits, '_' or '-', starting with a letter or digit (got {given}).")]
"""A user's or organisation's id as a request names it."""

DEFAULT_ORGANIZATION_ID = "default"
"""The organisation of users created without one (and of every user made before organisations existed)."""

ManagedRole = Literal["admin", "user"]
"""Roles created under /v1/organization/keys; worker keys are made under /v1/provider/worker_keys."""


class CreateUser(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: ChosenId = None
    """Chosen by the admin (e.g. `alice`), or generated."""
    name: str = Field(default="", max_length=256)
    allowed_models: list[str] | None = Field(default=None, max_length=256)
    """Catalogue ids or aliases the user's keys may use; omitted: every model."""
    organization_id: ChosenId = None
    """The organisation the user belongs to; it must exist. Omitted: the default organisation."""
    role: MemberRole = "member"
    """`admin`: an administrator of that organisation, who lists and cancels its members' batches."""


class User(BaseModel):
    id: str
    object: Literal["organization.user"] = "organization.user"
    name: str
    allowed_models: list[str] | None
    """Catalogue ids; null: every model."""
    created_at: int
    organization_id: str = DEFAULT_ORGANIZATION_ID
    role: MemberRole = "member"
    """Their role in the organisation: `member`, or `admin` (lists and cancels its members' batches)."""


class CreateOrganization(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: ChosenId = None
    """Chosen by the admin (e.g. `acme`), or generated."""
    name: str = Field(default="", max_length=256)


class Organization(BaseModel):
    id: str
    object: Literal["organization"] = "organization"
    name: str
    created_at: int
    """Seconds since the epoch; 0 for the default organisation, which always exists."""


class CreateKey(BaseModel):
    model_config = ConfigDict(extra="forbid")

    user_id: ChosenId = None
    """The user the key acts for; it must exist. Omitted: a key with every model allowed."""
    role: ManagedRole = "user"
    name: str = Field(default="", max_length=256)


class CreateWorkerKey(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(default="", max_length=256)


class ApiKey(BaseModel):
    id: str
    """`key_…`: the public id used to revoke it; the raw value is never stored."""
    object: Literal["organization.api_key"] = "organization.api_key"
    name: str
    role: Literal["admin", "user", "worker"]
    user_id: str | None
    created_at: int | None
    provider_id: str | None = None
    """For a worker key: the provider it belongs to; null for an admin's worker key and for API keys."""
    last_used_at: int | None = None
    """Seconds since the epoch, to within a minute."""
    revoked: bool = False
    value: str | None = None
    """The raw key, only in the answer that created it."""


class DeletedApiKey(BaseModel):
    id: str
    object: Literal["organization.api_key.deleted"] = "organization.api_key.deleted"
    deleted: bool = True
    cancelled_batches: list[str]
    """Batches of the key that were still live; their remaining lines fail with `authorization_revoked`."""


class ModelAlias(BaseModel):
    alias: str
    object: Literal["model.alias"] = "model.alias"
    model: str
    """The catalogue id the alias resolves to."""


class Me(BaseModel):
    """`GET /v1/me`: who the calling key is, for a client deciding what to offer (the dashboard hides what a key
    may not use)."""

    object: Literal["me"] = "me"
    key_id: str
    role: str
    """`admin` or `user` (worker keys are refused on the API)."""
    user_id: str | None
    organization_id: str
    organization_role: MemberRole | None
    """The user's role in their organisation; None for a key without a user."""
