"""Admin routes: organisations and users with their model access; the rules are the use cases' (`usecases.accounts`),
shared with the CLI. Keys have their own routes (`keys.py`)."""

import re

from aiohttp import web

from contracts.api.organization import (
    DEFAULT_ORGANIZATION_ID,
    USER_ID_PATTERN,
    CreateOrganization,
    CreateUser,
    Organization,
    User,
)
from contracts.api.page import ListPage
from services.gateway.context import accounts, deps
from services.gateway.http.bodies import answer, read_body
from services.gateway.usecases import accounts as usecases
from services.gateway.usecases.accounts import DEFAULT_ORGANIZATION, organization_object, user_object
from services.gateway.usecases.refusals import not_found


async def create_user(request: web.Request) -> web.Response:
    return answer(await usecases.create_user(accounts(request), await read_body(request, CreateUser)))


async def list_users(request: web.Request) -> web.Response:
    """Every user, or with `?organization_id=` the members of one organisation."""
    read_model, organization = deps(request).read_model, request.query.get("organization_id")
    users = await (read_model.list_users() if organization is None else read_model.organization_members(organization))
    return answer(ListPage[User](data=[user_object(u) for u in sorted(users, key=lambda u: (u.created_at, u.user_id))]))


async def create_organization(request: web.Request) -> web.Response:
    return answer(await usecases.create_organization(accounts(request), await read_body(request, CreateOrganization)))


async def list_organizations(request: web.Request) -> web.Response:
    """The default organisation first, then every created one, oldest first."""
    records = sorted(await deps(request).read_model.list_organizations(),
                     key=lambda o: (o.created_at, o.organization_id))
    return answer(ListPage[Organization](data=[DEFAULT_ORGANIZATION, *map(organization_object, records)]))


async def retrieve_organization(request: web.Request) -> web.Response:
    organization_id = request.match_info["organization_id"]
    if organization_id == DEFAULT_ORGANIZATION_ID:
        return answer(DEFAULT_ORGANIZATION)
    valid = re.fullmatch(USER_ID_PATTERN, organization_id) is not None  # `&` or `a.b` name no KV key
    record = await deps(request).read_model.get_organization(organization_id) if valid else None
    if record is None:
        raise not_found("organization", organization_id)
    return answer(organization_object(record))
