"""The provider portal and the anomalies view against a real gateway, ledger, NATS and S3: a user registers a
provider, manages its worker keys, sees the executor that joined with one and the lines it served; nobody else does."""

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

from contracts.events.batch import (
    BatchAssigned,
    BatchFinalizing,
    BatchProgressed,
    BatchStarted,
    BatchValidated,
)
from contracts.events.executor import DeviceMemory, ExecutorAdvert, ExecutorRegistered
from services.runtime.nats.fleet import Fleet
from tests.factories import batch_created
from tests.integration.gateway_support import Gateway, jsonl
from tests.integration.test_gateway_accounts import admin_key, bearer, gateway, user_with_key
from tests.integration.test_gateway_oversight import member, organization
from tests.support import advertise

__all__ = ["gateway"]

CHAT = "smollm2-135m-instruct-q4_1"
Headers = dict[str, str]


async def eventually(fetch: Callable[[], Awaitable[Any]], ready: Callable[[Any], bool], timeout_s: float = 20) -> Any:
    """Poll a read until the ledger has folded what the test published."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await fetch()
        if ready(value) or time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.1)


async def _json(request: Any) -> Any:
    """The JSON of a request's answer."""
    return await (await request).json()


async def register(gateway: Gateway, headers: Headers, name: str) -> dict[str, Any]:
    answer = await gateway.client.post("/v1/provider/providers", json={"name": name}, headers=headers)
    assert answer.status == 200, await answer.text()
    provider: dict[str, Any] = await answer.json()
    return provider


async def admin_owner_and_other(gateway: Gateway) -> tuple[Headers, Headers, Headers]:
    """An admin key, and the keys of two users."""
    admin = await admin_key(gateway)
    _, owner_key = await user_with_key(gateway, admin)
    _, other_key = await user_with_key(gateway, admin)
    return admin, bearer(owner_key["value"]), bearer(other_key["value"])


async def provider_with_worker_key(gateway: Gateway, owner: Headers, name: str) -> tuple[str, dict[str, Any]]:
    """A new provider's worker-keys path, and a worker key made there."""
    provider = await register(gateway, owner, name)
    keys_path = f"/v1/provider/providers/{provider['id']}/worker_keys"
    created = await gateway.client.post(keys_path, json={"name": f"{name} rack"}, headers=owner)
    assert created.status == 200, await created.text()
    worker: dict[str, Any] = await created.json()
    return keys_path, worker


async def executors(gateway: Gateway, headers: Headers) -> dict[str, dict[str, Any]]:
    answer = await gateway.client.get("/v1/provider/executors", headers=headers)
    assert answer.status == 200, await answer.text()
    return {e["id"]: e for e in (await answer.json())["data"]}


async def run_lines_on(gateway: Gateway, executor_id: str, worker_key_id: str, completed: int, failed: int) -> None:
    """The facts an executor's registration and one attempt of a batch put on the stream, and its heartbeat."""
    now_ms = int(time.time() * 1000)
    advert = ExecutorAdvert(executor_id=executor_id, engine="llamacpp", engine_version="test", models=[CHAT],
                            loaded_models=[CHAT], devices=[DeviceMemory(name="cpu", total_bytes=8 << 30,
                                                                        free_bytes=6 << 30)],
                            slots=2, heartbeat_at=now_ms)
    await advertise(await Fleet.open(gateway.bus), advert)
    batch_id = f"batch_{secrets.token_hex(8)}"
    for fact in [
        ExecutorRegistered(aggregate_id=executor_id, advert=advert, started_at=now_ms, worker_key_id=worker_key_id),
        batch_created(batch_id, "key_someone", "files/file-x", created_at=now_ms // 1000,
                      expires_at=now_ms // 1000 + 86400),
        BatchValidated(aggregate_id=batch_id, total_lines=completed + failed, model=CHAT),
        BatchAssigned(aggregate_id=batch_id, executor_id=executor_id, attempt=1, lease_token="lease"),
        BatchStarted(aggregate_id=batch_id, executor_id=executor_id, attempt=1, engine="llamacpp",
                     engine_version="test"),
        BatchProgressed(aggregate_id=batch_id, attempt=1, chunk=0, chunk_key="c0", completed=completed - 1,
                        failed=failed),
        BatchProgressed(aggregate_id=batch_id, attempt=1, chunk=1, chunk_key="c1", completed=completed,
                        failed=failed),
    ]:
        await gateway.bus.publish(fact)


async def test_a_user_registers_a_provider_and_manages_its_worker_keys(gateway: Gateway) -> None:
    admin = await admin_key(gateway)
    _, key = await user_with_key(gateway, admin)
    owner = bearer(key["value"])
    provider = await register(gateway, owner, "GPU farm")
    assert provider["id"].startswith("prov_") and provider["name"] == "GPU farm"
    listed = await (await gateway.client.get("/v1/provider/providers", headers=owner)).json()
    assert [p["id"] for p in listed["data"]] == [provider["id"]]

    keys_path = f"/v1/provider/providers/{provider['id']}/worker_keys"
    created = await gateway.client.post(keys_path, json={"name": "rack 1"}, headers=owner)
    assert created.status == 200, await created.text()
    worker = await created.json()
    assert worker["value"].startswith("wk-") and (worker["role"], worker["provider_id"]) == ("worker", provider["id"])
    listed = await (await gateway.client.get(keys_path, headers=owner)).json()
    assert [(k["id"], k["value"]) for k in listed["data"]] == [(worker["id"], None)]

    revoked = await gateway.client.delete(f"{keys_path}/{worker['id']}", headers=owner)
    assert revoked.status == 200, await revoked.text()
    listed = await eventually(lambda: _json(gateway.client.get(keys_path, headers=owner)),
                              lambda page: page["data"][0]["revoked"])
    assert listed["data"][0]["revoked"]
    assert (await gateway.client.get("/v1/models", headers=bearer(worker["value"]))).status == 401


async def test_another_user_gets_404_for_every_thing_of_a_provider_not_theirs(gateway: Gateway) -> None:
    admin, owner, other = await admin_owner_and_other(gateway)
    keys_path, worker = await provider_with_worker_key(gateway, owner, "private")
    provider_id = worker["provider_id"]
    for method, path in [("GET", f"/v1/provider/providers/{provider_id}"), ("GET", keys_path),
                         ("POST", keys_path), ("DELETE", f"{keys_path}/{worker['id']}"),
                         ("GET", f"/v1/provider/executors?provider_id={provider_id}"),
                         ("GET", "/v1/provider/providers/prov.*"), ("GET", "/v1/provider/executors?provider_id=a%20b")]:
        answer = await gateway.client.request(method, path, json={"name": "theirs"}, headers=other)
        assert answer.status == 404, (method, path)
        error = (await answer.json())["error"]
        assert (error["type"], error["code"]) == ("not_found_error", "not_found")
    assert (await (await gateway.client.get("/v1/provider/providers", headers=other)).json())["data"] == []
    # An admin manages any provider's keys.
    assert (await gateway.client.get(keys_path, headers=admin)).status == 200


async def test_the_owner_sees_their_executor_with_the_lines_it_served_and_others_do_not(gateway: Gateway) -> None:
    admin, owner, other = await admin_owner_and_other(gateway)
    _, worker = await provider_with_worker_key(gateway, owner, "serving")
    await register(gateway, other, "someone else's")
    executor_id = f"exec-{secrets.token_hex(4)}"

    await run_lines_on(gateway, executor_id, worker["id"], completed=5, failed=2)

    seen = await eventually(lambda: executors(gateway, owner),
                            lambda found: found.get(executor_id, {}).get("lines_served") == 7)
    mine = seen[executor_id]
    assert (mine["provider_id"], mine["worker_key_id"], mine["lines_served"]) == (worker["provider_id"], worker["id"],
                                                                                 7)
    assert (mine["health"], mine["models"], mine["loaded_models"]) == ("live", [CHAT], [CHAT])
    assert mine["memory"] == {"free_bytes": 6 << 30, "total_bytes": 8 << 30} and mine["heartbeat_age_s"] < 15
    assert executor_id not in await executors(gateway, other)
    assert (await executors(gateway, admin))[executor_id]["lines_served"] == 7


async def test_admins_see_the_ledgers_anomalies_and_users_may_not(gateway: Gateway) -> None:
    admin = await admin_key(gateway)
    user = await gateway.new_key()
    batch_id = f"batch_{secrets.token_hex(8)}"
    await gateway.bus.publish(batch_created(batch_id, "key_someone", "files/file-x", created_at=int(time.time()),
                                            expires_at=int(time.time()) + 86400))
    await gateway.bus.publish(BatchFinalizing(aggregate_id=batch_id, attempt=1))  # never started: illegal

    page = await eventually(lambda: _json(gateway.client.get("/v1/admin/anomalies", headers=admin)),
                            lambda p: any(a["aggregate_id"] == batch_id for a in p["data"]))
    [anomaly] = [a for a in page["data"] if a["aggregate_id"] == batch_id]
    assert (anomaly["aggregate_type"], anomaly["event_type"], anomaly["reason"]) == (
        "batch", "batch.finalizing", "finalizing is not allowed while validating")
    assert anomaly["sequence"] > 0 and abs(anomaly["created_at"] - time.time()) < 60
    refused = await gateway.client.get("/v1/admin/anomalies", headers=user)
    assert refused.status == 403 and (await refused.json())["error"]["type"] == "permission_error"


async def test_a_new_provider_is_unapproved_until_an_admin_approves_it_and_only_admins_may(gateway: Gateway) -> None:
    admin, owner, _ = await admin_owner_and_other(gateway)
    org = await organization(gateway, admin)
    _, org_admin = await member(gateway, admin, org, "ada", role="admin")
    provider = await register(gateway, owner, "rack")
    assert (provider["status"], provider["approved_organizations"], provider["organization_id"]) == (
        "unapproved", [], "default")
    approve = f"/v1/provider/providers/{provider['id']}/approve"

    refused = await gateway.client.post(approve, headers=owner)  # its own owner, a member, may not
    assert refused.status == 403 and (await refused.json())["error"]["code"] == "insufficient_permissions"
    other_org = await gateway.client.post(approve, json={"organization_id": "default"}, headers=org_admin)
    assert other_org.status == 403 and (await other_org.json())["error"]["param"] == "organization_id"
    _, default_admin = await member(gateway, admin, "default", "dee", role="admin")
    everyone = await gateway.client.post(approve, headers=default_admin)  # the default organisation is everyone's
    assert everyone.status == 403 and (await everyone.json())["error"]["code"] == "insufficient_permissions"
    missing = await gateway.client.post("/v1/provider/providers/prov_0000000000000000/approve", headers=org_admin)
    assert missing.status == 404 and (await missing.json())["error"]["type"] == "not_found_error"

    for_org = await _json(gateway.client.post(approve, headers=org_admin))
    assert (for_org["status"], for_org["approved_organizations"]) == ("unapproved", [org])
    platform = await _json(gateway.client.post(approve, headers=admin))
    assert (platform["status"], platform["approved_organizations"]) == ("approved", [org])
    shown = await eventually(lambda: _json(gateway.client.get(f"/v1/provider/providers/{provider['id']}",
                                                              headers=owner)),
                             lambda p: p["status"] == "approved")
    assert shown["approved_organizations"] == [org]
    withdrawn = await _json(gateway.client.post(f"/v1/provider/providers/{provider['id']}/unapprove", headers=admin))
    assert (withdrawn["status"], withdrawn["approved_organizations"]) == ("unapproved", [org])


async def test_a_batch_is_created_with_its_placement_and_a_bad_one_is_refused(gateway: Gateway) -> None:
    headers = await gateway.new_key()
    file = await (await gateway.upload(headers, jsonl("a"))).json()
    body = {"input_file_id": file["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    bad = await gateway.client.post("/v1/batches", json={**body, "placement": "anywhere"}, headers=headers)
    assert bad.status == 400 and (await bad.json())["error"]["code"] == "invalid_placement"
    created = await _json(gateway.client.post("/v1/batches", json={**body, "placement": "own_organization"},
                                              headers=headers))
    assert created["placement"] == "own_organization"
    default = await _json(gateway.client.post("/v1/batches", json=body, headers=headers))
    shown = await eventually(lambda: _json(gateway.client.get(f"/v1/batches/{default['id']}", headers=headers)),
                             lambda b: b.get("placement") is not None)
    assert shown["placement"] == "approved_providers"


async def test_an_admin_approves_and_credits_only_organisations_that_exist(gateway: Gateway) -> None:
    admin, owner, _ = await admin_owner_and_other(gateway)
    org = await organization(gateway, admin)
    approve = f"/v1/provider/providers/{(await register(gateway, owner, 'typo'))['id']}/approve"

    for unknown, status in (("no-such-org", {404}), ("a.b c*>", {400, 404})):  # a malformed id may be a 400
        refused = await gateway.client.post(approve, json={"organization_id": unknown}, headers=admin)
        assert refused.status in status, await refused.text()
        credited = await gateway.client.post("/v1/billing/grants", json={"organization_id": unknown,
                                                                        "amount_usd": "1"}, headers=admin)
        assert credited.status in status, await credited.text()

    approved = await _json(gateway.client.post(approve, json={"organization_id": org}, headers=admin))
    assert approved["approved_organizations"] == [org]
    assert (await gateway.client.post(approve, json={"organization_id": "default"}, headers=admin)).status == 200
