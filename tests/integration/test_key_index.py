"""API keys filed under their holders and their ids, against a real gateway, ledger and broker: a user's key list,
key limit and revocation read only that user's keys (never every tenant's keys listed), a provider's worker keys
likewise, and a read model made before the index is given it by the ledger at its next start, a replay agreeing."""

import contextlib
import secrets
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from contracts.billing import ModelPrice
from contracts.events.account import CreditsGranted, CreditsReserved
from contracts.events.executor import DeviceMemory, ExecutorAdvert, ExecutorRegistered
from contracts.events.key import KeyCreated, UserCreated
from contracts.events.provider import ProviderRegistered
from contracts.readmodel import ExecutorRecord, provider_holder
from contracts.subjects import HOLDERS_INDEXED_KEY, OVERDRAWN_INDEXED_KEY, READ_MODEL_BUCKET, overdrawn_key
from services.gateway.usecases.revocation import find_key
from services.ledger import app as ledger_app
from services.ledger.replay import diff_against_live
from services.runtime.nats.bus import EventBus
from services.runtime.nats.kv import read_latest
from services.runtime.nats.readmodel import ReadModel
from services.runtime.process.settings import ConnectionSettings
from tests.conftest import RunningNats
from tests.integration.gateway_support import Gateway, key_listings_during, running_gateway
from tests.integration.test_gateway_accounts import admin_key, bearer, user_with_key
from tests.integration.test_gateway_oversight import member, new_batch, organization
from tests.integration.test_gateway_providers import provider_with_worker_key
from tests.integration.test_ledger_rebuild import folded_through, running_ledger


def advert(executor_id: str) -> ExecutorAdvert:
    return ExecutorAdvert(executor_id=executor_id, engine="llamacpp", engine_version="t", models=["m"],
                          loaded_models=[], slots=1, heartbeat_at=1,
                          devices=[DeviceMemory(name="cpu", total_bytes=1 << 30, free_bytes=1 << 29)])


@pytest.fixture(scope="module")
async def gateway(connection: ConnectionSettings) -> AsyncIterator[Gateway]:
    async with running_gateway(connection) as running:
        yield running


async def test_a_users_keys_are_made_listed_and_revoked_without_reading_every_tenants_keys(
        gateway: Gateway) -> None:
    admin = await admin_key(gateway)
    org = await organization(gateway, admin)
    user_id, alice = await member(gateway, admin, org, "alice")
    for _ in range(5):  # other tenants' keys
        await gateway.new_key()
    made: dict[str, Any] = {}

    async def steps() -> None:
        answer = await gateway.client.post("/v1/organization/keys", headers=alice, json={"name": "second"})
        assert answer.status == 200, await answer.text()
        made.update(await answer.json())
        listed = await gateway.client.get("/v1/organization/keys", headers=alice)
        made["listed"] = [key["id"] for key in (await listed.json())["data"]]
        gone = await gateway.client.delete(f"/v1/organization/keys/{made['id']}", headers=alice)
        assert gone.status == 200, await gone.text()
        again = await gateway.client.delete(f"/v1/organization/keys/key_{secrets.token_hex(8)}", headers=alice)
        assert again.status == 404

    assert await key_listings_during(gateway, steps) == []
    assert made["id"] in made["listed"] and len(made["listed"]) == 2  # the member's first key and this one
    assert made["user_id"] == user_id


async def test_a_providers_worker_keys_are_made_listed_and_revoked_without_reading_every_tenants_keys(
        gateway: Gateway) -> None:
    admin = await admin_key(gateway)
    _, key = await user_with_key(gateway, admin)
    owner = bearer(key["value"])
    for _ in range(5):  # other tenants' keys
        await gateway.new_key()
    seen: dict[str, Any] = {}

    async def steps() -> None:
        keys_path, worker = await provider_with_worker_key(gateway, owner, "rack")
        listed = await (await gateway.client.get(keys_path, headers=owner)).json()
        seen["listed"] = [k["id"] for k in listed["data"]]
        seen["worker"] = worker["id"]
        for path in ("/v1/provider/executors", "/v1/provider/providers"):
            answer = await gateway.client.get(path, headers=owner)
            assert answer.status == 200, await answer.text()
        assert (await gateway.client.post("/v1/provider/providers", json={"name": "second"},
                                          headers=owner)).status == 200
        revoked = await gateway.client.delete(f"{keys_path}/{worker['id']}", headers=owner)
        assert revoked.status == 200, await revoked.text()

    assert await key_listings_during(gateway, steps) == []
    assert seen["listed"] == [seen["worker"]]


async def test_an_organisations_members_and_their_batches_are_listed_without_reading_every_user_or_batch(
        gateway: Gateway) -> None:
    admin = await admin_key(gateway)
    org, elsewhere = [await organization(gateway, admin) for _ in range(2)]
    (_, carla), (dan_id, dan), (_, erin) = [await member(gateway, admin, where, name, role) for where, name, role in (
        (org, "carla", "admin"), (org, "dan", "member"), (elsewhere, "erin", "member"))]
    dans, erins = [await new_batch(gateway, headers) for headers in (dan, erin)]
    seen: dict[str, Any] = {}

    async def steps() -> None:
        for name, path, headers in (
                ("by_org_admin", "/v1/batches?scope=organization&limit=100", carla),
                ("by_admin", f"/v1/batches?scope=organization&organization_id={org}&limit=100", admin),
                ("members", f"/v1/organization/users?organization_id={org}", admin),
                ("everything", "/v1/batches?scope=all&limit=100", admin)):
            answer = await gateway.client.get(path, headers=headers)
            assert answer.status == 200, await answer.text()
            seen[name] = [item["id"] for item in (await answer.json())["data"]]

    listings = await key_listings_during(gateway, steps, (b".user.>", f"{READ_MODEL_BUCKET}.batch.>".encode()))
    assert listings == []
    assert dans["id"] in seen["everything"] and erins["id"] in seen["everything"]
    assert dans["id"] in seen["by_org_admin"] and erins["id"] not in seen["by_org_admin"]
    assert dans["id"] in seen["by_admin"] and erins["id"] not in seen["by_admin"]
    assert dan_id in seen["members"] and len(seen["members"]) == 2  # carla and dan


async def test_a_read_model_made_before_the_holder_indexes_is_given_them_at_the_ledgers_next_start(
        fresh_nats: RunningNats, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bus = await EventBus.connect(fresh_nats.url, "tests")
    digest, worker = secrets.token_hex(32), secrets.token_hex(32)
    try:
        await bus.publish(UserCreated(aggregate_id="alice"))
        await bus.publish(KeyCreated(aggregate_id=digest[:32], key_sha256=digest, role="user", label="laptop",
                                     user_id="alice"))
        await bus.publish(ProviderRegistered(aggregate_id="prov_alice", display_name="rack", owner_key_id="key_a",
                                             owner_user_id="alice"))
        await bus.publish(KeyCreated(aggregate_id=worker[:32], key_sha256=worker, role="worker", label="rack",
                                     provider_id="prov_alice"))
        price = ModelPrice(input_per_mtok_usd=Decimal(1), output_per_mtok_usd=Decimal(1))
        await bus.publish(CreditsReserved(aggregate_id="org-poor", batch_id="batch_poor", amount_micros=5, model="m",
                                          endpoint="/v1/chat/completions", price=price))
        await bus.publish(CreditsGranted(aggregate_id="org-poor", grant_id="g1", amount_micros=-10))
        db_path = tmp_path / "ledger.sqlite"

        async def files_nothing(*args: Any) -> None:
            return None

        with monkeypatch.context() as older:  # as a ledger made before the key index folded
            older.setattr(ReadModel, "_file_under_holders", files_nothing)
            older.setattr(ReadModel, "_file_overdrawn", files_nothing)
            older.setattr(ledger_app, "index_holders", files_nothing)
            older.setattr(ledger_app, "index_members_and_overdrawn", files_nothing)
            async with running_ledger(fresh_nats.url, db_path) as app:
                await folded_through(app, 6)
                read_model = await ReadModel.open(bus)
                found = await read_model.get_api_key(worker)
                assert found is not None
                # An executor registered as registrations were made before they named their provider.
                await bus.publish(ExecutorRegistered(aggregate_id="exec-1", advert=advert("exec-1"), started_at=1,
                                                     worker_key_id=found.key_id))
                await folded_through(app, 7)
        read_model = await ReadModel.open(bus)
        record = await read_model.get_api_key(digest)
        assert record is not None and not await read_model.holders_indexed()
        assert [d for d, _ in await read_model.held_api_keys("user-alice")] == [digest]  # read whole meanwhile
        assert await read_model.find_api_key(record.key_id) == (digest, record)
        assert [u.user_id for u in await read_model.organization_members("default")] == ["alice"]
        assert [a.account_id for a in await read_model.overdrawn_accounts()] == ["org-poor"]  # every account read
        assert await read_latest(read_model.kv, overdrawn_key("org-poor")) is None

        async with running_ledger(fresh_nats.url, db_path) as app:
            read_model = await ReadModel.open(bus)
            assert await read_model.holders_indexed()
            assert [d for d, _ in await read_model.held_api_keys("user-alice")] == [digest]
            assert await read_model.held_api_keys(provider_holder("prov_none")) == []
            assert await read_model.find_api_key(record.key_id) == (digest, record)
            assert await read_model.find_api_key("key_unknown") is None
            assert [p.provider_id for p in await read_model.owner_providers("user-alice")] == ["prov_alice"]
            executors = await read_model.provider_executors("prov_alice")
            assert executors is not None and [e.executor_id for e in executors] == ["exec-1"]
            assert [u.user_id for u in await read_model.organization_members("default")] == ["alice"]
            assert await read_model.organization_members("org-none") == []
            assert [a.account_id for a in await read_model.overdrawn_accounts()] == ["org-poor"]
            assert await read_model._is_marked(OVERDRAWN_INDEXED_KEY)
            assert await diff_against_live(bus, read_model) == []

            # A key an older ledger (a standby, mid-upgrade) folded after the index was made is not filed under its
            # id: an admin's revocation still finds it.
            stray = secrets.token_hex(32)
            with monkeypatch.context() as older:
                older.setattr(ReadModel, "_file_under_holders", files_nothing)
                await bus.publish(KeyCreated(aggregate_id=stray[:32], key_sha256=stray, role="user", label="stray",
                                             user_id="alice"))
                await folded_through(app, 8)
            stray_record = await read_model.get_api_key(stray)
            assert stray_record is not None
            assert await find_key(read_model, stray_record.key_id) is None
            assert await find_key(read_model, stray_record.key_id, everywhere=True) == (stray, stray_record)
    finally:
        await bus.close()


async def test_a_tenant_makes_its_own_keys_at_a_control_calls_pace_and_revokes_them_whatever_its_budget(
        connection: ConnectionSettings) -> None:
    async with running_gateway(connection, control_call_burst=2, control_calls_per_s=0.01) as paced:
        admin = await admin_key(paced)
        org = await organization(paced, admin)
        _, alice = await member(paced, admin, org, "alice")
        answers = [await paced.client.post("/v1/organization/keys", headers=alice, json={}) for _ in range(3)]
        assert [answer.status for answer in answers] == [200, 200, 429]
        assert (await answers[2].json())["error"]["code"] == "rate_limit_exceeded"
        made = await answers[0].json()
        # Whoever spent the budget (a thief with one of the user's keys) must not keep a key from being revoked.
        assert (await paced.client.delete(f"/v1/organization/keys/{made['id']}", headers=alice)).status == 200
        for _ in range(3):  # an admin's key management is not paced
            assert (await paced.client.post("/v1/organization/keys", headers=admin, json={})).status == 200


@contextlib.asynccontextmanager
async def indexed_read_model(url: str) -> AsyncIterator[tuple[EventBus, ReadModel]]:
    """A read model whose keys, providers and executors are indexed, and the bus it is read through."""
    bus = await EventBus.connect(url, "tests")
    try:
        read_model = await ReadModel.open(bus)
        await read_model.mark_indexed(HOLDERS_INDEXED_KEY)
        yield bus, read_model
    finally:
        await bus.close()


async def test_an_executor_is_filed_under_its_provider_once_however_often_its_record_changes(
        fresh_nats: RunningNats) -> None:
    async with indexed_read_model(fresh_nats.url) as (bus, read_model):
        filings: list[str] = []

        async def seen(message: Any) -> None:
            filings.append(message.subject)
        watching = await bus.nc.subscribe(f"$KV.{READ_MODEL_BUCKET}.executors.>", cb=seen)
        for served in range(5):  # each chunk an attempt commits changes the record
            await read_model.put("executor.exec-1", ExecutorRecord(
                executor_id="exec-1", engine="llamacpp", engine_version="t", models=["m"], provider_id="prov_a",
                status="online", started_at=1, lines_served=served))
        await bus.nc.flush()
        await watching.unsubscribe()
        assert filings == [f"$KV.{READ_MODEL_BUCKET}.executors.prov_a.exec-1"]
        [found] = await read_model.provider_executors("prov_a") or []
        assert found.lines_served == 4


async def test_an_executor_that_registered_with_another_provider_is_listed_under_that_one_only(
        fresh_nats: RunningNats) -> None:
    async with indexed_read_model(fresh_nats.url) as (_, read_model):
        for provider_id in ("prov_a", "prov_b"):  # its owner moved it to another of their providers
            await read_model.put("executor.exec-2", ExecutorRecord(
                executor_id="exec-2", engine="llamacpp", engine_version="t", models=["m"], provider_id=provider_id,
                status="online", started_at=1))
        assert await read_model.provider_executors("prov_a") == []
        assert [record.provider_id for record in await read_model.provider_executors("prov_b") or []] == ["prov_b"]
