"""Accounts and keys against a real gateway, ledger, NATS and S3: admin routes, model access, revocation,
worker keys, and isolation between tenants."""

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Awaitable

import aiohttp
import pytest

from contracts.events.batch import BatchCancelRequested, BatchCreated
from contracts.events.key import KeyCreated
from contracts.ids import hash_api_key
from infra import account_tools as cli
from services.gateway.context import DEPS
from services.gateway.usecases.revocation import revoke_key
from services.runtime.process.settings import ConnectionSettings
from tests.integration.gateway_support import Gateway, jsonl, running_gateway
from tests.support import batch_facts

CHAT = "smollm2-135m-instruct-q4_1"
EMBED = "smollm2-135m-embed"
Headers = dict[str, str]


@pytest.fixture(scope="module")
async def gateway(connection: ConnectionSettings) -> AsyncIterator[Gateway]:
    async with running_gateway(connection) as running:
        yield running


def bearer(key: str) -> Headers:
    return {"Authorization": f"Bearer {key}"}


async def admin_key(gateway: Gateway) -> Headers:
    key = f"gk-{secrets.token_hex(16)}"
    digest = hash_api_key(key)
    await gateway.bus.publish(KeyCreated(aggregate_id=digest[:32], key_sha256=digest, role="admin", label="admin"))
    for _ in range(200):
        if (await gateway.client.get("/v1/organization/users", headers=bearer(key))).status == 200:
            return bearer(key)
        await asyncio.sleep(0.05)
    raise TimeoutError("the ledger never folded the admin key")


async def user_with_key(gateway: Gateway, admin: Headers, models: list[str] | None = None) -> tuple[str, dict]:
    """A new user (optionally limited to `models`) and a key of theirs, as the admin routes return it."""
    user_id = f"u-{secrets.token_hex(4)}"
    body: dict[str, object] = {"id": user_id, "name": user_id}
    if models is not None:
        body["allowed_models"] = models
    created = await gateway.client.post("/v1/organization/users", json=body, headers=admin)
    assert created.status == 200, await created.text()
    key = await gateway.client.post("/v1/organization/keys", json={"user_id": user_id, "name": "laptop"},
                                    headers=admin)
    assert key.status == 200, await key.text()
    return user_id, await key.json()


async def test_a_user_key_may_not_manage_users_or_keys(gateway: Gateway) -> None:
    user = await gateway.new_key()
    for method, path in [("POST", "/v1/organization/users"), ("GET", "/v1/organization/users"),
                         ("POST", "/v1/organization/keys"), ("GET", "/v1/organization/keys"),
                         ("DELETE", "/v1/organization/keys/key_0000000000000000"),
                         ("POST", "/v1/provider/worker_keys"), ("GET", "/v1/provider/worker_keys"),
                         ("DELETE", "/v1/provider/worker_keys/key_0000000000000000"),
                         ("GET", "/v1/organization/overview")]:
        answer = await gateway.client.request(method, path, json={}, headers=user)
        assert answer.status == 403, (method, path)
        assert (await answer.json())["error"]["type"] == "permission_error"


async def test_a_created_key_is_shown_once_and_listed_without_its_value(gateway: Gateway) -> None:
    admin = await admin_key(gateway)
    user_id, key = await user_with_key(gateway, admin)
    assert key["value"].startswith("gk-") and key["user_id"] == user_id and key["role"] == "user"
    assert (await gateway.client.get("/v1/models", headers=bearer(key["value"]))).status == 200
    listed = await (await gateway.client.get("/v1/organization/keys", headers=admin)).json()
    mine = [k for k in listed["data"] if k["id"] == key["id"]]
    assert len(mine) == 1 and mine[0]["value"] is None
    assert all(k["value"] is None for k in listed["data"])
    assert key["value"] not in str(listed)
    for _ in range(100):  # last use is recorded off the request path
        listed = await (await gateway.client.get("/v1/organization/keys", headers=admin)).json()
        if next(k for k in listed["data"] if k["id"] == key["id"])["last_used_at"]:
            break
        await asyncio.sleep(0.05)
    assert abs(next(k for k in listed["data"] if k["id"] == key["id"])["last_used_at"] - time.time()) < 60


async def test_models_lists_only_what_the_user_may_use(gateway: Gateway) -> None:
    admin = await admin_key(gateway)
    _, limited = await user_with_key(gateway, admin, models=["smollm2"])  # an alias names its catalogue id
    _, unlimited = await user_with_key(gateway, admin)
    mine = await (await gateway.client.get("/v1/models", headers=bearer(limited["value"]))).json()
    assert [m["id"] for m in mine["data"]] == [CHAT]
    everything = await (await gateway.client.get("/v1/models", headers=bearer(unlimited["value"]))).json()
    assert {m["id"] for m in everything["data"]} == {CHAT, EMBED}
    aliases = await (await gateway.client.get("/v1/models/aliases", headers=bearer(limited["value"]))).json()
    assert [(a["alias"], a["model"]) for a in aliases["data"]] == [("smollm2", CHAT)]
    assert (await gateway.client.get(f"/v1/models/{EMBED}", headers=bearer(limited["value"]))).status == 404
    assert (await gateway.client.get(f"/v1/models/{EMBED}", headers=bearer(unlimited["value"]))).status == 200
    refused = await gateway.client.post("/v1/organization/users", json={"allowed_models": ["gpt-4"]},
                                        headers=admin)
    assert refused.status == 400 and (await refused.json())["error"]["code"] == "unsupported_model"


async def test_a_batch_carries_its_owners_model_access_to_the_validator(gateway: Gateway) -> None:
    admin = await admin_key(gateway)
    _, limited = await user_with_key(gateway, admin, models=[CHAT])
    headers = bearer(limited["value"])
    file = await (await gateway.upload(headers, jsonl("a"))).json()
    batch = await (await gateway.client.post("/v1/batches", json={
        "input_file_id": file["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"},
        headers=headers)).json()
    facts = await batch_facts(gateway.bus, batch["id"], lambda f: isinstance(f, BatchCreated), timeout_s=10)
    created = facts[-1]
    assert isinstance(created, BatchCreated) and created.allowed_models == [CHAT]


async def test_another_user_gets_404_for_every_id_of_the_first(gateway: Gateway) -> None:
    admin = await admin_key(gateway)
    _, alice_key = await user_with_key(gateway, admin)
    _, bob_key = await user_with_key(gateway, admin)
    alice, bob = bearer(alice_key["value"]), bearer(bob_key["value"])
    file = await (await gateway.upload(alice, jsonl("a", "b"))).json()
    batch = await (await gateway.client.post("/v1/batches", json={
        "input_file_id": file["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"},
        headers=alice)).json()
    attempts = [("GET", f"/v1/files/{file['id']}"), ("GET", f"/v1/files/{file['id']}/content"),
                ("DELETE", f"/v1/files/{file['id']}"), ("GET", f"/v1/batches/{batch['id']}"),
                ("POST", f"/v1/batches/{batch['id']}/cancel"), ("GET", f"/v1/batches/{batch['id']}/events"),
                ("GET", f"/v1/batches/{batch['id']}/errors")]
    for method, path in attempts:
        answer = await gateway.client.request(method, path, headers=bob)
        assert answer.status == 404, (method, path, answer.status)
        assert (await answer.json())["error"]["type"] == "not_found_error"
    # Creating a batch from another user's file is the same 404.
    theirs = await gateway.client.post("/v1/batches", json={
        "input_file_id": file["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}, headers=bob)
    assert theirs.status == 404
    files = await (await gateway.client.get("/v1/files", headers=bob)).json()
    batches = await (await gateway.client.get("/v1/batches", headers=bob)).json()
    assert file["id"] not in str(files) and batch["id"] not in str(batches)
    # Nothing of Alice's changed: the file and batch are still hers, whole.
    assert (await gateway.client.get(f"/v1/files/{file['id']}/content", headers=alice)).status == 200
    assert (await (await gateway.client.get(f"/v1/batches/{batch['id']}", headers=alice)).json())["status"] in (
        "validating", "validated", "failed")


USER_ROUTES = [("GET", "/v1/models"), ("GET", "/v1/models/aliases"), ("GET", f"/v1/models/{CHAT}"),
               ("POST", "/v1/files"), ("GET", "/v1/files"), ("GET", "/v1/files/file-x"),
               ("GET", "/v1/files/file-x/content"), ("DELETE", "/v1/files/file-x"), ("POST", "/v1/batches"),
               ("GET", "/v1/batches"), ("GET", "/v1/batches/batch_x"), ("POST", "/v1/batches/batch_x/cancel"),
               ("GET", "/v1/batches/batch_x/events"), ("GET", "/v1/batches/batch_x/errors"),
               ("GET", "/v1/organization/keys"), ("GET", "/v1/provider/worker_keys"),
               ("GET", "/v1/organization/overview")]


async def test_a_worker_key_is_refused_on_every_user_route(gateway: Gateway) -> None:
    admin = await admin_key(gateway)
    made = await gateway.client.post("/v1/provider/worker_keys", json={"name": "gpu-7"}, headers=admin)
    worker = await made.json()
    assert made.status == 200 and worker["value"].startswith("wk-") and worker["role"] == "worker"
    listed = await (await gateway.client.get("/v1/provider/worker_keys", headers=admin)).json()
    assert worker["id"] in [k["id"] for k in listed["data"]]
    assert worker["id"] not in str(await (await gateway.client.get("/v1/organization/keys", headers=admin)).json())
    for method, path in USER_ROUTES:
        answer = await gateway.client.request(method, path, headers=bearer(worker["value"]))
        assert answer.status == 401, (method, path, answer.status)
        assert (await answer.json())["error"]["code"] == "invalid_api_key"


async def test_a_revoked_key_is_refused_at_once_and_its_live_batches_stop(gateway: Gateway) -> None:
    admin = await admin_key(gateway)
    _, key = await user_with_key(gateway, admin)
    headers = bearer(key["value"])
    file = await (await gateway.upload(headers, jsonl("a"))).json()
    batch = await (await gateway.client.post("/v1/batches", json={
        "input_file_id": file["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"},
        headers=headers)).json()
    revoked = await gateway.client.delete(f"/v1/organization/keys/{key['id']}", headers=admin)
    assert revoked.status == 200 and (await revoked.json())["cancelled_batches"] == [batch["id"]]
    refused = await gateway.client.get("/v1/files", headers=headers)
    assert refused.status == 401 and (await refused.json())["error"]["code"] == "invalid_api_key"
    facts = await batch_facts(gateway.bus, batch["id"], lambda f: isinstance(f, BatchCancelRequested), 10)
    cancel = facts[-1]
    assert isinstance(cancel, BatchCancelRequested) and cancel.code == "authorization_revoked"
    listed = await (await gateway.client.get("/v1/organization/keys", headers=admin)).json()
    assert [k["revoked"] for k in listed["data"] if k["id"] == key["id"]] == [True]
    again = await gateway.client.delete(f"/v1/organization/keys/{key['id']}", headers=admin)
    assert again.status == 200
    assert (await gateway.client.delete("/v1/organization/keys/key_nope", headers=admin)).status == 404


async def test_a_key_revoked_elsewhere_is_refused_within_a_second(gateway: Gateway) -> None:
    """Revoked from the CLI or another gateway: this gateway hears of it through its watch on the read model."""
    admin = await admin_key(gateway)
    _, key = await user_with_key(gateway, admin)
    headers = bearer(key["value"])
    assert (await gateway.client.get("/v1/files", headers=headers)).status == 200  # now cached
    deps = gateway.client.app[DEPS]
    started = time.monotonic()
    await revoke_key(gateway.bus, deps.read_model, hash_api_key(key["value"]), None)
    while (await gateway.client.get("/v1/files", headers=headers)).status != 401:
        assert time.monotonic() - started < 1.0, "the revoked key was still accepted after a second"
        await asyncio.sleep(0.01)


async def test_the_cli_creates_a_users_key_and_revokes_it(gateway: Gateway, connection: ConnectionSettings,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SHESHNAG_NATS_URL", connection.nats_url)
    user_id = f"cli-{secrets.token_hex(4)}"
    await cli.create_user(user_id, "From the CLI", EMBED)
    await cli.create_key("user", "cli", user_id)
    raw = capsys.readouterr().out.split()[-1]
    headers = bearer(raw)
    for _ in range(200):
        models = await gateway.client.get("/v1/models", headers=headers)
        if models.status == 200:
            break
        await asyncio.sleep(0.05)
    assert [m["id"] for m in (await models.json())["data"]] == [EMBED]
    record = await gateway.client.app[DEPS].read_model.get_api_key(hash_api_key(raw))
    assert record is not None
    assert await cli.revoke_key_by_id(record.key_id) == 0
    for _ in range(100):
        if (await gateway.client.get("/v1/models", headers=headers)).status == 401:
            break
        await asyncio.sleep(0.01)
    assert (await gateway.client.get("/v1/models", headers=headers)).status == 401
    assert await cli.revoke_key_by_id("key_unknown") == 1


async def refused_by_cli(create: Awaitable[None]) -> str:
    """What the CLI printed when it refused (`sys.exit(message)`: the message, exit status 1)."""
    with pytest.raises(SystemExit) as refused:
        await create
    return str(refused.value.code)


async def message(answer: aiohttp.ClientResponse) -> str:
    return str((await answer.json())["error"]["message"])


async def test_the_cli_refuses_what_the_admin_routes_refuse_with_the_same_message(
        gateway: Gateway, connection: ConnectionSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHESHNAG_NATS_URL", connection.nats_url)
    admin = await admin_key(gateway)
    user_id, organization_id, nobody = (f"{what}-{secrets.token_hex(4)}" for what in ("cli", "org", "nobody"))
    unknown_model = await gateway.client.post("/v1/organization/users", headers=admin,
                                              json={"id": user_id, "allowed_models": ["gpt-4"]})
    assert unknown_model.status == 400
    assert await refused_by_cli(cli.create_user(user_id, "", "gpt-4")) == await message(unknown_model)
    no_organization = await gateway.client.post("/v1/organization/users", headers=admin,
                                                json={"id": user_id, "organization_id": nobody})
    assert no_organization.status == 404
    assert await refused_by_cli(cli.create_user(user_id, "", None, nobody)) == await message(no_organization)
    bad_id = await gateway.client.post("/v1/organization/users", json={"id": "a.b"}, headers=admin)
    assert bad_id.status == 400
    assert await refused_by_cli(cli.create_user("a.b", "", None)) == await message(bad_id)

    await cli.create_user(user_id, "", None)
    taken = await gateway.client.post("/v1/organization/users", json={"id": user_id}, headers=admin)
    assert taken.status == 409
    assert await refused_by_cli(cli.create_user(user_id, "", None)) == await message(taken)

    await cli.create_organization(organization_id, "Acme")
    taken = await gateway.client.post("/v1/organization/organizations", json={"id": organization_id}, headers=admin)
    assert taken.status == 409
    assert await refused_by_cli(cli.create_organization(organization_id, "")) == await message(taken)
    default = await gateway.client.post("/v1/organization/organizations", json={"id": "default"}, headers=admin)
    assert await refused_by_cli(cli.create_organization("default", "")) == await message(default)

    no_user = await gateway.client.post("/v1/organization/keys", json={"user_id": nobody}, headers=admin)
    assert no_user.status == 404
    assert await refused_by_cli(cli.create_key("user", "", nobody)) == await message(no_user)


async def test_an_admin_sees_the_fleet_queue_and_running_batches_in_the_overview(gateway: Gateway) -> None:
    answer = await gateway.client.get("/v1/organization/overview", headers=await admin_key(gateway))
    assert answer.status == 200
    view = await answer.json()
    assert {"executors", "batches_by_status", "queued", "running", "consumers"} <= view.keys()
