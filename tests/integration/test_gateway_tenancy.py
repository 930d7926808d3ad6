"""Tenancy against a real gateway, ledger, NATS and S3: organisations, ownership by user (any key of a user
acts on what another created), limits per user, the per-owner index, and brute force on keys."""

import asyncio
import secrets
from collections.abc import AsyncIterator

import pytest

from contracts.events.key import KeyCreated
from contracts.ids import hash_api_key, new_api_key
from services.gateway.context import DEPS
from services.runtime.nats.readmodel import ReadModel
from services.runtime.process.settings import ConnectionSettings
from tests.integration.gateway_support import WAIT_S, Gateway, jsonl, running_gateway

Headers = dict[str, str]
QUOTA = 60_000
ACTIVE_LIMIT = 2
AUTH_LIMIT, AUTH_WINDOW_S = 4, 2.0


@pytest.fixture(scope="module")
async def gateway(connection: ConnectionSettings) -> AsyncIterator[Gateway]:
    async with running_gateway(connection, storage_quota_bytes=QUOTA, max_active_batches=ACTIVE_LIMIT,
                               auth_failure_limit=AUTH_LIMIT, auth_failure_window_s=AUTH_WINDOW_S) as running:
        yield running


def read_model(gateway: Gateway) -> ReadModel:
    return gateway.client.app[DEPS].read_model


async def admin_key(gateway: Gateway) -> Headers:
    """An admin key, waited for in the read model: polling the API with it would count failed authentications."""
    raw = f"gk-{secrets.token_hex(16)}"
    digest = hash_api_key(raw)
    await gateway.bus.publish(KeyCreated(aggregate_id=digest[:32], key_sha256=digest, role="admin", label="admin"))
    assert await read_model(gateway).wait_for(lambda: read_model(gateway).get_api_key(digest), lambda r: True,
                                              WAIT_S) is not None
    return {"Authorization": f"Bearer {raw}"}


async def user_with_keys(gateway: Gateway, admin: Headers, keys: int = 2, **user: str) -> tuple[str, list[Headers]]:
    user_id = f"u-{secrets.token_hex(4)}"
    created = await gateway.client.post("/v1/organization/users", json={"id": user_id, **user}, headers=admin)
    assert created.status == 200, await created.text()
    made = []
    for n in range(keys):
        key = await gateway.client.post("/v1/organization/keys", json={"user_id": user_id, "name": f"key {n}"},
                                        headers=admin)
        assert key.status == 200, await key.text()
        made.append({"Authorization": f"Bearer {(await key.json())['value']}"})
    return user_id, made


async def new_batch(gateway: Gateway, key: Headers, file_id: str) -> dict[str, object]:
    answer = await gateway.client.post("/v1/batches", headers=key, json={
        "input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h", "hold": True})
    assert answer.status == 200, await answer.text()
    return dict(await answer.json())


async def file_id_of(gateway: Gateway, key: Headers, content: bytes) -> str:
    answer = await gateway.upload(key, content)
    assert answer.status == 200, await answer.text()
    return str((await answer.json())["id"])


async def test_an_admin_creates_lists_and_retrieves_organizations(gateway: Gateway) -> None:
    admin = await admin_key(gateway)
    org_id = f"acme-{secrets.token_hex(3)}"
    created = await gateway.client.post("/v1/organization/organizations", json={"id": org_id, "name": "Acme"},
                                        headers=admin)
    assert created.status == 200
    assert await created.json() == {"id": org_id, "object": "organization", "name": "Acme",
                                    "created_at": (await created.json())["created_at"]}
    listed = [o["id"] for o in (await (await gateway.client.get("/v1/organization/organizations",
                                                                headers=admin)).json())["data"]]
    assert listed[0] == "default" and org_id in listed
    one = await gateway.client.get(f"/v1/organization/organizations/{org_id}", headers=admin)
    assert (await one.json())["name"] == "Acme"
    again = await gateway.client.post("/v1/organization/organizations", json={"id": org_id}, headers=admin)
    assert again.status == 409 and (await again.json())["error"]["code"] == "organization_exists"
    for missing_id in ("nope", "%26", "a.b", "x" * 65):
        missing = await gateway.client.get(f"/v1/organization/organizations/{missing_id}", headers=admin)
        assert missing.status == 404 and (await missing.json())["error"]["type"] == "not_found_error", missing_id


async def test_an_organization_and_a_user_of_one_name_are_both_created(gateway: Gateway) -> None:
    """Neither create is taken for a repeat of the other (their facts' ids name their kinds) and answered 200 for a
    record that never appears."""
    admin = await admin_key(gateway)
    name = f"acme-{secrets.token_hex(3)}"
    organization = await gateway.client.post("/v1/organization/organizations", json={"id": name}, headers=admin)
    user = await gateway.client.post("/v1/organization/users", json={"id": name, "organization_id": name},
                                     headers=admin)
    assert (organization.status, user.status) == (200, 200), await user.text()

    shown = await gateway.client.get(f"/v1/organization/organizations/{name}", headers=admin)
    users = (await (await gateway.client.get("/v1/organization/users", headers=admin)).json())["data"]
    assert shown.status == 200
    assert [u["organization_id"] for u in users if u["id"] == name] == [name]


@pytest.mark.parametrize("path", ["/v1/organization/organizations", "/v1/organization/users"])
async def test_creates_of_one_id_racing_make_one_and_the_others_are_told_it_exists(gateway: Gateway,
                                                                                     path: str) -> None:
    admin = await admin_key(gateway)
    chosen = f"race-{secrets.token_hex(3)}"

    answers = await asyncio.gather(*(gateway.client.post(path, json={"id": chosen, "name": f"name {n}"},
                                                         headers=admin) for n in range(8)))

    statuses = sorted(answer.status for answer in answers)
    assert statuses == [200] + [409] * 7, (statuses, [await a.text() for a in answers if a.status == 429])
    [winner] = [await answer.json() for answer in answers if answer.status == 200]
    codes = {(await answer.json())["error"]["code"] for answer in answers if answer.status == 409}
    assert codes <= {"organization_exists", "user_exists"} and len(codes) == 1
    listed = (await (await gateway.client.get(path, headers=admin)).json())["data"]
    assert [item["name"] for item in listed if item["id"] == chosen] == [winner["name"]]


async def test_a_user_key_may_not_manage_organizations(gateway: Gateway) -> None:
    _, (key, _) = await user_with_keys(gateway, await admin_key(gateway))
    for method, path in [("POST", "/v1/organization/organizations"), ("GET", "/v1/organization/organizations"),
                         ("GET", "/v1/organization/organizations/default")]:
        answer = await gateway.client.request(method, path, json={}, headers=key)
        assert answer.status == 403 and (await answer.json())["error"]["type"] == "permission_error"


async def test_a_user_belongs_to_the_organization_it_is_created_in_or_else_the_default_one(gateway: Gateway) -> None:
    admin = await admin_key(gateway)
    org_id = f"org-{secrets.token_hex(3)}"
    assert (await gateway.client.post("/v1/organization/organizations", json={"id": org_id},
                                      headers=admin)).status == 200
    member, _ = await user_with_keys(gateway, admin, keys=0, organization_id=org_id)
    loner, _ = await user_with_keys(gateway, admin, keys=0)
    users = {u["id"]: u for u in (await (await gateway.client.get("/v1/organization/users",
                                                                   headers=admin)).json())["data"]}
    assert (users[member]["organization_id"], users[loner]["organization_id"]) == (org_id, "default")
    members = await (await gateway.client.get(f"/v1/organization/users?organization_id={org_id}",
                                              headers=admin)).json()
    assert [u["id"] for u in members["data"]] == [member]
    refused = await gateway.client.post("/v1/organization/users", json={"id": "x-1", "organization_id": "nowhere"},
                                        headers=admin)
    assert refused.status == 404 and "organization" in (await refused.json())["error"]["message"]


async def test_a_second_key_of_the_same_user_sees_downloads_cancels_and_deletes_the_firsts_work(
        gateway: Gateway) -> None:
    _, (laptop, phone) = await user_with_keys(gateway, await admin_key(gateway))
    content = jsonl("shared-1")
    file_id = await file_id_of(gateway, laptop, content)
    batch = await new_batch(gateway, laptop, file_id)
    spare = await file_id_of(gateway, laptop, jsonl("spare"))

    assert (await gateway.client.get(f"/v1/files/{file_id}", headers=phone)).status == 200
    assert await (await gateway.client.get(f"/v1/files/{file_id}/content", headers=phone)).read() == content
    assert {file_id, spare} <= {f["id"] for f in (await (await gateway.client.get(
        "/v1/files", headers=phone)).json())["data"]}
    assert (await (await gateway.client.get(f"/v1/batches/{batch['id']}", headers=phone)).json())["id"] == batch["id"]
    assert [b["id"] for b in (await (await gateway.client.get("/v1/batches", headers=phone)).json())["data"]] == [
        batch["id"]]
    in_use = await gateway.client.delete(f"/v1/files/{file_id}", headers=phone)
    assert in_use.status == 409 and (await in_use.json())["error"]["code"] == "file_in_use"
    cancelled = await gateway.client.post(f"/v1/batches/{batch['id']}/cancel", headers=phone)
    assert cancelled.status == 200 and (await cancelled.json())["status"] == "cancelling"
    deleted = await gateway.client.delete(f"/v1/files/{spare}", headers=phone)
    assert deleted.status == 200 and (await deleted.json())["deleted"] is True
    assert (await gateway.client.get(f"/v1/files/{spare}", headers=laptop)).status == 404


async def test_the_same_content_from_another_key_of_the_user_returns_the_first_file(gateway: Gateway) -> None:
    _, (laptop, phone) = await user_with_keys(gateway, await admin_key(gateway))
    first = await file_id_of(gateway, laptop, jsonl("dedup-per-user"))
    again = await gateway.upload(phone, jsonl("dedup-per-user"))
    assert (await again.json())["id"] == first and again.headers["X-Sheshnag-Deduplicated-From"] == first


async def test_a_key_of_another_user_gets_404_for_every_id_of_the_first(gateway: Gateway) -> None:
    admin = await admin_key(gateway)
    _, (owner,) = await user_with_keys(gateway, admin, keys=1)
    _, (stranger,) = await user_with_keys(gateway, admin, keys=1)
    file_id = await file_id_of(gateway, owner, jsonl("private"))
    batch_id = (await new_batch(gateway, owner, file_id))["id"]
    for method, path in [("GET", f"/v1/files/{file_id}"), ("GET", f"/v1/files/{file_id}/content"),
                         ("DELETE", f"/v1/files/{file_id}"), ("GET", f"/v1/batches/{batch_id}"),
                         ("POST", f"/v1/batches/{batch_id}/cancel"), ("POST", f"/v1/batches/{batch_id}/release"),
                         ("GET", f"/v1/batches/{batch_id}/events"), ("GET", f"/v1/batches/{batch_id}/errors")]:
        answer = await gateway.client.request(method, path, headers=stranger)
        assert answer.status == 404, (method, path, answer.status)
    assert (await (await gateway.client.get("/v1/files", headers=stranger)).json())["data"] == []
    assert (await (await gateway.client.get("/v1/batches", headers=stranger)).json())["data"] == []
    used = await gateway.client.post("/v1/batches", headers=stranger, json={
        "input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"})
    assert used.status == 404


async def test_active_batches_and_storage_count_per_user_across_its_keys(gateway: Gateway) -> None:
    admin = await admin_key(gateway)
    _, (laptop, phone) = await user_with_keys(gateway, admin)
    _, (other,) = await user_with_keys(gateway, admin, keys=1)
    for n in range(ACTIVE_LIMIT):
        key = laptop if n % 2 else phone
        await new_batch(gateway, key, await file_id_of(gateway, key, jsonl(f"active-{n}")))
    over = await gateway.client.post("/v1/batches", headers=laptop, json={
        "input_file_id": await file_id_of(gateway, laptop, jsonl("one-too-many")),
        "endpoint": "/v1/chat/completions", "completion_window": "24h"})
    assert over.status == 429 and (await over.json())["error"]["code"] == "too_many_active_batches"
    await new_batch(gateway, other, await file_id_of(gateway, other, jsonl("another-user")))

    big = jsonl(*(f"line-{i:05d}-{'x' * 200}" for i in range(70)))  # ~38 KiB, more than half the quota
    assert (await gateway.upload(laptop, big)).status == 200
    refused = await gateway.upload(phone, big.replace(b"line-", b"more-"))
    assert refused.status == 400 and (await refused.json())["error"]["code"] == "storage_quota_exceeded"
    assert (await gateway.upload(other, big.replace(b"line-", b"more-"))).status == 200


async def test_the_owner_index_holds_exactly_the_users_live_files_and_every_batch(gateway: Gateway) -> None:
    user_id, (laptop, phone) = await user_with_keys(gateway, await admin_key(gateway))
    kept = await file_id_of(gateway, laptop, jsonl("indexed-kept"))
    gone = await file_id_of(gateway, phone, jsonl("indexed-gone"))
    batch_id = (await new_batch(gateway, phone, kept))["id"]
    assert (await gateway.client.delete(f"/v1/files/{gone}", headers=laptop)).status == 200
    index = read_model(gateway)
    assert [r.file.id for r in await index.owner_files(f"user-{user_id}")] == [kept]
    assert [r.batch.id for r in await index.owner_batches(f"user-{user_id}")] == [batch_id]
    deleted = await index.get_file(gone)
    assert deleted is not None and deleted.deleted and deleted.owner == f"user-{user_id}"


async def test_guessing_from_one_address_is_refused_while_its_right_keys_keep_working(gateway: Gateway) -> None:
    """Last in this module: it fills the address's window (and waits for it to pass)."""
    weak_admin = await admin_key(gateway)  # `gk-` and 32 hex digits: not the generated shape, so guessable
    _, (key,) = await user_with_keys(gateway, weak_admin, keys=1)
    unused_weak = await admin_key(gateway)
    for _ in range(AUTH_LIMIT * 3):
        assert (await gateway.client.get("/v1/models", headers=key)).status == 200  # successes never count
    guesses = [await gateway.client.get("/v1/models", headers={"Authorization": f"Bearer gk-{secrets.token_hex(16)}"})
               for _ in range(AUTH_LIMIT * 3)]
    assert [g.status for g in guesses] == [401] * (AUTH_LIMIT - 1) + [429] * (AUTH_LIMIT * 2 + 1)
    error = (await guesses[-1].json())["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "too_many_failed_authentications")
    assert 1 <= int(guesses[-1].headers["Retry-After"]) <= AUTH_WINDOW_S
    wrong_generated = await gateway.client.get("/v1/models", headers={"Authorization": f"Bearer {new_api_key(False)}"})
    assert wrong_generated.status == 429
    assert (await gateway.client.get("/v1/models", headers=key)).status == 200
    assert (await gateway.client.get("/v1/models", headers=weak_admin)).status == 200  # it succeeded here before
    assert (await gateway.client.get("/v1/models", headers=unused_weak)).status == 429  # first use mid-guessing
    await asyncio.sleep(AUTH_WINDOW_S)
    assert (await gateway.client.get("/v1/models", headers=unused_weak)).status == 200
