"""The account and credit commands of `sheshnag` (`keys`, `users`, `organizations`, `credits`): the same use cases,
and the same refusals, as the admin routes of the gateway, against the broker SHESHNAG_NATS_URL names."""

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import NoReturn

from contracts.api.organization import DEFAULT_ORGANIZATION_ID, CreateKey, CreateOrganization, CreateUser
from contracts.billing import micros_to_usd, parse_usd
from contracts.events.key import KeyRole
from services.gateway.settings import GatewaySettings
from services.gateway.usecases import accounts as usecases
from services.gateway.usecases import billing
from services.gateway.usecases.accounts import Accounts
from services.gateway.usecases.refusals import ApiError, parse_fields
from services.gateway.usecases.revocation import find_key, revoke_key
from services.runtime.nats.bus import EventBus, tool_bus
from services.runtime.nats.readmodel import ReadModel
from services.runtime.process.settings import ConnectionSettings
from services.runtime.storage.catalogue import load_catalogue


@asynccontextmanager
async def connected(client_name: str) -> AsyncIterator[tuple[EventBus, ReadModel]]:
    """A bus to the broker SHESHNAG_NATS_URL names and the read model on it, until the block ends."""
    async with tool_bus(ConnectionSettings().nats_url, client_name) as bus:
        yield bus, await ReadModel.open(bus)


@asynccontextmanager
async def accounts(client_name: str) -> AsyncIterator[Accounts]:
    """The account use cases' ports, against SHESHNAG_NATS_URL: the same rules as the admin routes."""
    async with connected(client_name) as (bus, read_model):
        yield Accounts(bus, read_model, load_catalogue(ConnectionSettings().catalogue_path),
                       GatewaySettings().read_your_writes_s)


def refused(error: ApiError) -> NoReturn:
    """The message the HTTP route answers with, on stderr, and exit status 1."""
    sys.exit(error.body.message)


async def create_key(role: KeyRole, label: str, user_id: str | None) -> None:
    try:
        async with accounts("sheshnag-keys") as ports:
            if role == "worker":
                raw, _ = await usecases.create_key(ports, "worker", label or "worker key", user_id)
            else:
                body = parse_fields(CreateKey, {"user_id": user_id, "role": role, "name": label})
                raw, _ = await usecases.create_user_key(ports, body)
    except ApiError as error:
        refused(error)
    print(raw)


async def revoke_key_by_id(key_id: str) -> int:
    async with connected("sheshnag-keys") as (bus, read_model):
        found = await find_key(read_model, key_id)
        if found is None:
            print(f"no key {key_id}", file=sys.stderr)
            return 1
        stopped = await revoke_key(bus, read_model, found[0], None)
    print(f"revoked {key_id}; batches stopped: {', '.join(stopped) or 'none'}")
    return 0


async def create_user(user_id: str, name: str, models: str | None, organization_id: str | None = None,
                      role: str = "member") -> None:
    allowed = None if models is None else [m.strip() for m in models.split(",") if m.strip()]
    try:
        body = parse_fields(CreateUser, {"id": user_id, "name": name, "allowed_models": allowed,
                                         "organization_id": organization_id, "role": role})
        async with accounts("sheshnag-users") as ports:
            user = await usecases.create_user(ports, body)
    except ApiError as error:
        refused(error)
    print(user.id)


async def create_organization(organization_id: str, name: str) -> None:
    try:
        body = parse_fields(CreateOrganization, {"id": organization_id, "name": name})
        async with accounts("sheshnag-organizations") as ports:
            organization = await usecases.create_organization(ports, body)
    except ApiError as error:
        refused(error)
    print(organization.id)


async def list_records(kind: str) -> None:
    """`keys list` and `users list`: one line each, as the admin routes show them (never a key's value)."""
    async with connected(f"sheshnag-{kind}") as (_, read_model):
        if kind == "keys":
            for _, key in sorted(await read_model.list_api_keys(), key=lambda item: item[1].created_at or 0):
                state = "revoked" if key.revoked else "active"
                print(f"{key.key_id}\t{key.role}\t{state}\t{key.user_id or '-'}\t{key.label}")
        else:
            for user in sorted(await read_model.list_users(), key=lambda u: (u.created_at, u.user_id)):
                models = ",".join(user.allowed_models) if user.allowed_models is not None else "*"
                print(f"{user.user_id}\t{user.organization_id or 'default'}\t{user.role}\t{models}\t"
                      f"{user.display_name}")


async def every_organization(read_model: ReadModel) -> list[str]:
    """`credits show` without one: the default organisation, every organisation made and every account, each once
    (an organisation never granted credit has a balance of 0, and is shown with it)."""
    found = {DEFAULT_ORGANIZATION_ID}
    found.update(record.organization_id for record in await read_model.list_organizations())
    found.update(record.account_id for record in await read_model.list_accounts())
    return sorted(found, key=lambda name: (name != DEFAULT_ORGANIZATION_ID, name))


async def credits_tool(tool: str, organization_id: str | None, amount: str | None, note: str) -> int:
    """`credits grant ORG AMOUNT` states the grant (and waits for the ledger to show it); `credits show` prints
    balances as `GET /v1/billing/balance` answers them."""
    async with connected("sheshnag-credits") as (bus, read_model):
        if tool == "grant":
            assert organization_id is not None
            micros = parse_usd(amount)
            if micros is None or micros == 0:
                print(f"not an amount of USD: {amount!r}", file=sys.stderr)
                return 1
            fact = await billing.grant(bus, read_model, organization_id, micros, note, "cli",
                                       wait_s=GatewaySettings().read_your_writes_s)
            print(f"granted {micros_to_usd(micros)} USD to {organization_id} ({fact.grant_id})")
            organization_ids = [organization_id]
        else:
            organization_ids = [organization_id] if organization_id else await every_organization(read_model)
        for account_id in organization_ids:
            shown = billing.balance(account_id, await read_model.get_account(account_id), GatewaySettings().billing)
            print(f"{account_id}: balance {shown.balance_usd} USD, reserved {shown.reserved_usd}, available "
                  f"{shown.available_usd} ({shown.open_batches} open batches; granted {shown.granted_usd}, debited "
                  f"{shown.debited_usd})")
    return 0
