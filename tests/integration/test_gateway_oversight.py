"""Users manage their own keys, and administrators act on other people's batches (InferNode's account behaviours),
against a real gateway, ledger, NATS and S3: a user creates, lists and revokes only their own keys; an organisation's
administrator lists and cancels its members' batches, an admin key any batch, and such a cancel says who in the
batch's `errors.data`."""

import asyncio
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest

from services.runtime.process.settings import ConnectionSettings
from tests.integration.gateway_support import Gateway, jsonl, running_gateway
from tests.integration.test_gateway_accounts import Headers, admin_key, bearer

CHAT_BATCH = {"endpoint": "/v1/chat/completions", "completion_window": "24h"}


@pytest.fixture(scope="module")
async def gateway(connection: ConnectionSettings) -> AsyncIterator[Gateway]:
    async with running_gateway(connection) as running:
        yield running


async def organization(gateway: Gateway, admin: Headers) -> str:
    organization_id = f"org-{secrets.token_hex(4)}"
    made = await gateway.client.post("/v1/organization/organizations", json={"id": organization_id}, headers=admin)
    assert made.status == 200, await made.text()
    return organization_id


async def member(gateway: Gateway, admin: Headers, organization_id: str, name: str,
                 role: str = "member") -> tuple[str, Headers]:
    """A user of the organisation with `role`, and a key of theirs."""
    user_id = f"{name}-{secrets.token_hex(3)}"
    made = await gateway.client.post("/v1/organization/users", headers=admin, json={
        "id": user_id, "name": name.title(), "organization_id": organization_id, "role": role})
    assert made.status == 200, await made.text()
    assert (await made.json())["role"] == role
    key = await gateway.client.post("/v1/organization/keys", json={"user_id": user_id}, headers=admin)
    assert key.status == 200, await key.text()
    return user_id, bearer((await key.json())["value"])


async def new_batch(gateway: Gateway, headers: Headers) -> dict[str, Any]:
    file = await (await gateway.upload(headers, jsonl("a", "b"))).json()
    created = await gateway.client.post("/v1/batches", json={"input_file_id": file["id"], **CHAT_BATCH},
                                        headers=headers)
    assert created.status == 200, await created.text()
    return dict(await created.json())


async def errors_once_cancelling(gateway: Gateway, headers: Headers, batch_id: str) -> list[dict[str, Any]]:
    """The batch's `errors.data` once the ledger folded the cancel."""
    for _ in range(200):
        batch = await (await gateway.client.get(f"/v1/batches/{batch_id}", headers=headers)).json()
        if batch["status"] in ("cancelling", "cancelled"):
            return list((batch.get("errors") or {}).get("data", []))
        await asyncio.sleep(0.05)
    raise TimeoutError(f"batch {batch_id} never showed the cancel")


async def test_a_user_creates_lists_and_revokes_their_own_keys_and_no_one_elses(gateway: Gateway) -> None:
    admin = await admin_key(gateway)
    org = await organization(gateway, admin)
    alice_id, alice = await member(gateway, admin, org, "alice")
    bob_id, bob = await member(gateway, admin, org, "bob")

    made = await gateway.client.post("/v1/organization/keys", json={"name": "laptop"}, headers=alice)
    assert made.status == 200, await made.text()
    laptop = await made.json()
    assert laptop["value"].startswith("gk-") and laptop["user_id"] == alice_id and laptop["role"] == "user"
    assert (await gateway.client.get("/v1/files", headers=bearer(laptop["value"]))).status == 200

    listed = await (await gateway.client.get("/v1/organization/keys", headers=alice)).json()
    assert {key["user_id"] for key in listed["data"]} == {alice_id} and len(listed["data"]) == 2
    assert all(key.get("value") is None for key in listed["data"])
    bobs = await (await gateway.client.get("/v1/organization/keys", headers=bob)).json()
    assert laptop["id"] not in str(bobs) and {key["user_id"] for key in bobs["data"]} == {bob_id}

    # Another user's key is not there for Bob; an admin key or a key for another user is not Alice's to make.
    assert (await gateway.client.delete(f"/v1/organization/keys/{laptop['id']}", headers=bob)).status == 404
    for body, param in [({"role": "admin"}, "role"), ({"user_id": bob_id}, "user_id")]:
        refused = await gateway.client.post("/v1/organization/keys", json=body, headers=alice)
        assert refused.status == 403, body
        assert (await refused.json())["error"]["param"] == param
    # The users' routes stay an admin's.
    assert (await gateway.client.get("/v1/organization/users", headers=alice)).status == 403

    revoked = await gateway.client.delete(f"/v1/organization/keys/{laptop['id']}", headers=alice)
    assert revoked.status == 200 and (await revoked.json())["deleted"] is True
    assert (await gateway.client.get("/v1/files", headers=bearer(laptop["value"]))).status == 401
    assert (await gateway.client.get("/v1/files", headers=alice)).status == 200  # her other key goes on


async def test_an_organisations_administrator_lists_and_cancels_its_members_batches_and_the_batch_names_them(
        gateway: Gateway) -> None:
    admin = await admin_key(gateway)
    org, elsewhere = await organization(gateway, admin), await organization(gateway, admin)
    _, carla = await member(gateway, admin, org, "carla", role="admin")
    _, dan = await member(gateway, admin, org, "dan")
    _, erin = await member(gateway, admin, org, "erin")
    _, frank = await member(gateway, admin, elsewhere, "frank")
    dans, erins, franks = await new_batch(gateway, dan), await new_batch(gateway, erin), await new_batch(gateway, frank)

    overseen = await (await gateway.client.get("/v1/batches?scope=organization", headers=carla)).json()
    ids = {batch["id"] for batch in overseen["data"]}
    assert {dans["id"], erins["id"]} <= ids and franks["id"] not in ids
    assert (await gateway.client.get(f"/v1/batches/{dans['id']}", headers=carla)).status == 200
    assert (await gateway.client.get(f"/v1/batches/{franks['id']}", headers=carla)).status == 404
    # A member is no administrator: neither the scope nor another member's batch.
    assert (await gateway.client.get("/v1/batches?scope=organization", headers=dan)).status == 403
    assert (await gateway.client.get(f"/v1/batches/{erins['id']}", headers=dan)).status == 404
    assert (await gateway.client.post(f"/v1/batches/{erins['id']}/cancel", headers=dan)).status == 404

    cancelled = await gateway.client.post(f"/v1/batches/{dans['id']}/cancel", headers=carla)
    assert cancelled.status == 200, await cancelled.text()
    errors = await errors_once_cancelling(gateway, dan, dans["id"])
    entry = next(error for error in errors if error["code"] == "cancelled_by_org_admin")
    assert "Carla" in entry["message"] and org in entry["message"] and entry["line"] is None

    # The owner's own cancel adds no entry; the platform's admin's says so.
    assert (await gateway.client.post(f"/v1/batches/{erins['id']}/cancel", headers=erin)).status == 200
    assert not [e for e in await errors_once_cancelling(gateway, erin, erins["id"]) if e["code"].startswith(
        "cancelled_by")]
    assert (await gateway.client.post(f"/v1/batches/{franks['id']}/cancel", headers=admin)).status == 200
    codes = [error["code"] for error in await errors_once_cancelling(gateway, frank, franks["id"])]
    assert "cancelled_by_platform_admin" in codes


async def test_an_admin_key_lists_every_batch_or_one_organisations(gateway: Gateway) -> None:
    admin = await admin_key(gateway)
    org, elsewhere = await organization(gateway, admin), await organization(gateway, admin)
    _, gina = await member(gateway, admin, org, "gina")
    _, hugo = await member(gateway, admin, elsewhere, "hugo")
    ginas, hugos = await new_batch(gateway, gina), await new_batch(gateway, hugo)
    everything = str(await (await gateway.client.get("/v1/batches?scope=all&limit=100", headers=admin)).json())
    assert ginas["id"] in everything and hugos["id"] in everything
    one = await (await gateway.client.get(f"/v1/batches?scope=organization&organization_id={org}",
                                          headers=admin)).json()
    assert [batch["id"] for batch in one["data"]] == [ginas["id"]]
    assert (await gateway.client.get("/v1/batches?scope=all", headers=gina)).status == 403
    bad = await gateway.client.get("/v1/batches?scope=everyone", headers=admin)
    assert bad.status == 400 and (await bad.json())["error"]["param"] == "scope"
