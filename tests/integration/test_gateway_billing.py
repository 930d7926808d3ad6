"""Billing at the gateway, against a real gateway, ledger, NATS and S3: creates racing for one organisation's credit
never both reserve it, balances are each organisation's own, quotes reserve nothing, and every refusal is
OpenAI-shaped with its code."""

import asyncio
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from contracts.billing import parse_usd
from contracts.events.account import CreditsGranted
from services.gateway.background.credit_sweeper import stop_unpaid_batches
from services.gateway.context import DEPS
from services.runtime.process.settings import ConnectionSettings
from tests.integration.gateway_support import Gateway, jsonl, key_listings_during, running_gateway
from tests.integration.test_gateway_accounts import Headers, admin_key
from tests.integration.test_gateway_oversight import member, organization

CHAT_BATCH = {"endpoint": "/v1/chat/completions", "completion_window": "24h"}
CATALOGUE = Path(__file__).parents[2] / "infra" / "catalogue.toml"


@pytest.fixture(scope="module")
async def billed(connection: ConnectionSettings) -> AsyncIterator[Gateway]:
    async with running_gateway(connection, billing=True, credit_sweep_interval_s=0) as running:
        yield running


@pytest.fixture(scope="module")
async def unpriced(connection: ConnectionSettings, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Gateway]:
    catalogue = tmp_path_factory.mktemp("catalogue") / "catalogue.toml"
    catalogue.write_text("\n".join(line for line in CATALOGUE.read_text().splitlines()
                                   if not line.startswith("price =")))
    async with running_gateway(connection.model_copy(update={"catalogue_path": catalogue}), billing=True,
                               credit_sweep_interval_s=0) as running:
        yield running


def micros(amount: str) -> int:
    value = parse_usd(amount)
    assert value is not None
    return value


async def upload(gateway: Gateway, headers: Headers, *ids: str) -> str:
    answer = await gateway.upload(headers, jsonl(*ids))
    assert answer.status == 200, await answer.text()
    return str((await answer.json())["id"])


async def grant(gateway: Gateway, admin: Headers, organization_id: str, amount_usd: str) -> None:
    answer = await gateway.client.post("/v1/billing/grants", headers=admin,
                                       json={"organization_id": organization_id, "amount_usd": amount_usd})
    assert answer.status == 200, await answer.text()


async def balance(gateway: Gateway, headers: Headers, organization_id: str | None = None) -> dict[str, Any]:
    query = f"?organization_id={organization_id}" if organization_id else ""
    answer = await gateway.client.get(f"/v1/billing/balance{query}", headers=headers)
    assert answer.status == 200, await answer.text()
    return dict(await answer.json())


async def quote(gateway: Gateway, headers: Headers, file_id: str, **extra: Any) -> dict[str, Any]:
    answer = await gateway.client.post("/v1/batches/quote", headers=headers, json={"input_file_id": file_id, **extra})
    assert answer.status == 200, await answer.text()
    return dict(await answer.json())


async def test_creates_racing_for_one_organisations_credit_reserve_it_once(billed: Gateway) -> None:
    admin = await admin_key(billed)
    org = await organization(billed, admin)
    _, alice = await member(billed, admin, org, "alice")
    files = [await upload(billed, alice, f"r{n}a", f"r{n}b") for n in range(4)]
    worst = micros((await quote(billed, alice, files[0]))["price"]["max_usd"])
    assert worst > 0
    await grant(billed, admin, org, f"{worst / 1_000_000:.6f}")  # enough for one of the four

    answers = await asyncio.gather(*(billed.client.post("/v1/batches", headers=alice,
                                                        json={"input_file_id": file_id, **CHAT_BATCH})
                                     for file_id in files))
    statuses = sorted(answer.status for answer in answers)
    assert statuses == [200, 402, 402, 402], [await answer.text() for answer in answers]
    refusals = [(await answer.json())["error"] for answer in answers if answer.status == 402]
    assert {error["code"] for error in refusals} == {"insufficient_balance"}
    assert all(error["type"] == "invalid_request_error" and error["message"] for error in refusals)
    shown = await balance(billed, alice)
    assert shown["organization_id"] == org and micros(shown["reserved_usd"]) == worst
    assert shown["available_usd"] == "0.000000" and shown["open_batches"] == 1
    assert shown["last_event"]["type"] == "reservation"
    assert shown["last_event"]["endpoint"] == "/v1/chat/completions:batch"


async def test_a_price_ceiling_below_the_worst_case_is_refused_and_reserves_nothing(billed: Gateway) -> None:
    admin = await admin_key(billed)
    org = await organization(billed, admin)
    _, bob = await member(billed, admin, org, "bob")
    await grant(billed, admin, org, "10")
    file_id = await upload(billed, bob, "c1", "c2")
    for ceiling, status, code in (("0.000001", 402, "price_above_max"), ("three", 400, "invalid_metadata")):
        refused = await billed.client.post("/v1/batches", headers=bob, json={
            "input_file_id": file_id, **CHAT_BATCH, "metadata": {"max_price_usd": ceiling}})
        assert refused.status == status, await refused.text()
        error = (await refused.json())["error"]
        assert error["code"] == code and error["param"] == "metadata.max_price_usd"
    assert (await balance(billed, bob))["reserved_usd"] == "0.000000"
    created = await billed.client.post("/v1/batches", headers=bob, json={
        "input_file_id": file_id, **CHAT_BATCH, "metadata": {"max_price_usd": "3"}})
    assert created.status == 200, await created.text()


async def test_a_quote_reserves_nothing_and_bounds_the_price(billed: Gateway) -> None:
    admin = await admin_key(billed)
    org = await organization(billed, admin)
    _, carol = await member(billed, admin, org, "carol")
    file_id = await upload(billed, carol, "q1", "q2", "q3")
    quoted = await quote(billed, carol, file_id)
    assert quoted["object"] == "batch.quote" and quoted["billing_enabled"] and quoted["lines"] == 3
    assert quoted["model"] == "smollm2-135m-instruct-q4_1" and quoted["endpoint"] == "/v1/chat/completions"
    price = quoted["price"]
    assert 0 < micros(price["min_usd"]) <= micros(price["estimate_usd"]) <= micros(price["max_usd"])
    assert quoted["available_usd"] == "0.000000" and quoted["fits_balance"] is False
    assert quoted["queue"]["lines_ahead"] >= 0
    assert (await balance(billed, carol))["open_batches"] == 0
    missing = await billed.client.post("/v1/batches/quote", headers=carol, json={})
    assert missing.status == 400 and (await missing.json())["error"]["code"] == "missing_required_parameter"


async def test_each_organisation_sees_its_own_balance_and_only_admins_another(billed: Gateway) -> None:
    admin = await admin_key(billed)
    ours, theirs = await organization(billed, admin), await organization(billed, admin)
    _, dave = await member(billed, admin, ours, "dave")
    await grant(billed, admin, theirs, "7")
    assert (await balance(billed, dave))["balance_usd"] == "0.000000"
    refused = await billed.client.get(f"/v1/billing/balance?organization_id={theirs}", headers=dave)
    assert refused.status == 403 and (await refused.json())["error"]["code"] == "insufficient_permissions"
    assert (await balance(billed, admin, theirs))["balance_usd"] == "7.000000"
    accounts = await (await billed.client.get("/v1/billing/accounts", headers=admin)).json()
    assert theirs in {account["organization_id"] for account in accounts["data"]}
    assert (await billed.client.get("/v1/billing/accounts", headers=dave)).status == 403
    weird = await billed.client.get("/v1/billing/balance", params={"organization_id": "M\u00d5:\n"}, headers=admin)
    assert weird.status == 400 and (await weird.json())["error"]["code"] == "invalid_id"
    bad = await billed.client.post("/v1/billing/grants", headers=admin,
                                   json={"organization_id": theirs, "amount_usd": "1.2345678"})
    assert bad.status == 400 and (await bad.json())["error"]["code"] == "invalid_amount"


async def test_a_model_without_a_price_cannot_be_used_while_billing_is_on(unpriced: Gateway) -> None:
    admin = await admin_key(unpriced)
    file_id = await upload(unpriced, admin, "u1")
    refused = await unpriced.client.post("/v1/batches", headers=admin, json={"input_file_id": file_id, **CHAT_BATCH})
    assert refused.status == 409, await refused.text()
    assert (await refused.json())["error"]["code"] == "pricing_unavailable"


async def test_an_organisation_with_no_movement_yet_has_an_empty_balance(billed: Gateway) -> None:
    admin = await admin_key(billed)
    org = f"never-{secrets.token_hex(3)}"
    shown = await balance(billed, admin, org)
    assert shown == {**shown, "organization_id": org, "balance_usd": "0.000000", "last_event": None,
                     "billing_enabled": True}


async def test_a_grant_id_names_one_grant_however_long_after_it_is_sent_again(billed: Gateway) -> None:
    """The broker's dedup spans two minutes: a grant of the same id sent later (a billing script rerun) is the
    first again, never a second credit; one of another amount under that id is a 409."""
    admin = await admin_key(billed)
    organization_id = await organization(billed, admin)
    earlier = CreditsGranted(aggregate_id=organization_id, grant_id="topup-2026-12", amount_micros=micros("5"),
                             note="December", granted_by="k1")
    await billed.bus.publish(earlier.model_copy(update={"event_id": "published-hours-ago"}))  # past the dedup window
    body = {"organization_id": organization_id, "amount_usd": "5", "note": "December", "grant_id": "topup-2026-12"}

    again = await billed.client.post("/v1/billing/grants", headers=admin, json=body)
    other = await billed.client.post("/v1/billing/grants", headers=admin, json={**body, "amount_usd": "50"})

    assert again.status == 200 and (await again.json())["id"] == "topup-2026-12"
    assert other.status == 409 and (await other.json())["error"]["code"] == "idempotency_conflict"
    assert micros((await balance(billed, admin, organization_id))["granted_usd"]) == micros("5")


async def test_grants_of_one_new_id_racing_credit_once(billed: Gateway) -> None:
    admin = await admin_key(billed)
    organization_id = await organization(billed, admin)
    body = {"organization_id": organization_id, "note": "race", "grant_id": f"race-{secrets.token_hex(4)}"}

    answers = await asyncio.gather(*(billed.client.post("/v1/billing/grants", headers=admin,
                                                        json={**body, "amount_usd": str(n + 1)}) for n in range(6)))

    assert sorted(answer.status for answer in answers) == [200] + [409] * 5
    [won] = [await answer.json() for answer in answers if answer.status == 200]
    assert (await balance(billed, admin, organization_id))["granted_usd"] == won["amount_usd"]


async def overdrawn_once_folded(gateway: Gateway, admin: Headers, organization_id: str) -> None:
    for _ in range(400):
        if micros((await balance(gateway, admin, organization_id))["balance_usd"]) < 0:
            return
        await asyncio.sleep(0.025)
    raise TimeoutError("the ledger never folded the negative grant")


async def test_the_credit_sweep_stops_only_overdrawn_organisations_batches_and_reads_only_their_accounts(
        billed: Gateway) -> None:
    admin = await admin_key(billed)
    poor, rich = await organization(billed, admin), await organization(billed, admin)
    created: dict[str, str] = {}
    for org, name in ((poor, "pia"), (rich, "ron")):
        _, headers = await member(billed, admin, org, name)
        file_id = await upload(billed, headers, f"{name}-a", f"{name}-b")
        worst = micros((await quote(billed, headers, file_id))["price"]["max_usd"])
        await grant(billed, admin, org, f"{2 * worst / 1_000_000:.6f}")
        answer = await billed.client.post("/v1/batches", headers=headers, json={"input_file_id": file_id, **CHAT_BATCH})
        assert answer.status == 200, await answer.text()
        created[org] = (await answer.json())["id"]
    await grant(billed, admin, poor, "-1000")
    await overdrawn_once_folded(billed, admin, poor)
    deps = billed.client.app[DEPS]
    told: list[str] = []

    async def sweep() -> None:
        told.extend(await stop_unpaid_batches(deps))

    assert await key_listings_during(billed, sweep, (b".account.>",)) == []
    assert created[poor] in told and created[rich] not in told

    await grant(billed, admin, poor, "2000")  # back above zero: no longer filed as overdrawn
    for _ in range(400):
        if micros((await balance(billed, admin, poor))["balance_usd"]) >= 0:
            break
        await asyncio.sleep(0.025)
    assert poor not in [account.account_id for account in await deps.read_model.overdrawn_accounts()]
