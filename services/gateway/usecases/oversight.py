"""Who besides its owner may see and cancel a batch: an admin key any; an organisation's `admin` user its members'.
Also what such a cancel adds to `errors.data` (`cancelled_by_org_admin`, `cancelled_by_platform_admin`)."""

import asyncio
import re
from typing import Literal

from contracts.api.organization import DEFAULT_ORGANIZATION_ID, USER_ID_PATTERN
from contracts.events.batch import AdminCancelCode
from contracts.ids import owner_id, owner_user
from contracts.readmodel import ApiKeyRecord, ProviderRecord, UserRecord
from services.gateway.usecases.files import is_valid_id
from services.gateway.usecases.refusals import not_found
from services.runtime.nats.read_entries import BatchIndexEntry
from services.runtime.nats.readmodel import ReadModel

Standing = Literal["owner", "org_admin", "platform_admin"]
"""Why the caller may act on a batch."""


def organization_of(user: UserRecord | None) -> str:
    """The user's organisation (also their billing account); no user, or none, is the default's."""
    return user.organization if user is not None else DEFAULT_ORGANIZATION_ID


async def administered_organization(read_model: ReadModel, caller: ApiKeyRecord) -> UserRecord | None:
    """The caller's user when they administer their organisation (None otherwise)."""
    if caller.role != "user" or caller.user_id is None:
        return None
    user = await read_model.get_user(caller.user_id)
    return user if user is not None and user.role == "admin" else None


async def owning_user(read_model: ReadModel, owner: str) -> UserRecord | None:
    """The user who owns batches as `owner`; None for a key with no user."""
    user_id = owner_user(owner)
    return None if user_id is None else await read_model.get_user(user_id)


async def standing(read_model: ReadModel, caller: ApiKeyRecord, owner: str) -> Standing | None:
    """The caller's standing towards what `owner` owns; None: none (it is not there, as far as the caller can tell)."""
    if owner == caller.owner:
        return "owner"
    if caller.role == "admin":
        return "platform_admin"
    admin = await administered_organization(read_model, caller)
    if admin is None:
        return None
    member = await owning_user(read_model, owner)
    return "org_admin" if member is not None and organization_of(member) == organization_of(admin) else None


async def members_index(read_model: ReadModel, organization: str) -> dict[str, list[BatchIndexEntry]]:
    """The index of batches of every member of `organization`, by owner."""
    owners = [owner_id(user.user_id, "") for user in await read_model.organization_members(organization)]
    return dict(zip(owners, await asyncio.gather(*(read_model.owner_batch_index(owner) for owner in owners)),
                    strict=True))


async def cancel_entry(read_model: ReadModel, caller: ApiKeyRecord, by: Standing) -> tuple[AdminCancelCode, str] | None:
    """The `errors.data` entry (code, message) a cancel by `caller` adds; None for the owner's own."""
    if by == "platform_admin":
        return "cancelled_by_platform_admin", "Cancelled by an administrator of the platform."
    if by == "org_admin":
        admin = await administered_organization(read_model, caller)
        name = (admin.display_name or admin.user_id) if admin is not None else caller.label
        return ("cancelled_by_org_admin",
                f"Cancelled by {name}, an administrator of organization {organization_of(admin)}.")
    return None


def owns(caller: ApiKeyRecord, provider: ProviderRecord) -> bool:
    """Whether the caller manages the provider: its owner, or an admin key."""
    return caller.role == "admin" or caller.owner == provider.owner


async def managed_provider(read_model: ReadModel, caller: ApiKeyRecord, provider_id: str) -> ProviderRecord:
    """The provider, when the caller may manage it; 404 otherwise, so others' providers are not even confirmed."""
    record = await read_model.get_provider(provider_id) if is_valid_id(provider_id) else None
    if record is None or not owns(caller, record):
        raise not_found("provider", provider_id)
    return record


async def existing_organization(read_model: ReadModel, organization_id: str) -> str:
    """`organization_id`, if it names an organisation (the default one included); 404 otherwise (an operator's typo
    must not approve for, or credit, an organisation nobody can belong to)."""
    if organization_id == DEFAULT_ORGANIZATION_ID:
        return organization_id
    valid = re.fullmatch(USER_ID_PATTERN, organization_id) is not None  # `&` or `a.b` name no KV key
    if not valid or await read_model.get_organization(organization_id) is None:
        raise not_found("organization", organization_id)
    return organization_id
