"""An owner's limits hold under races over two gateways on one broker and over several keys of one user: active
batches, stored bytes and control calls belong to the user, and no concurrent burst of requests gets past them."""

import asyncio
import contextlib
import secrets
import subprocess
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest

from contracts.events.key import KeyCreated
from contracts.ids import hash_api_key, new_api_key, new_key_id
from services.gateway.context import DEPS
from services.runtime.process.settings import ConnectionSettings
from tests.integration.gateway_pair import Headers, gateway_process, key_of_role, running_gateways
from tests.integration.gateway_support import WAIT_S, Gateway, jsonl

ACTIVE_LIMIT, BURST, MAX_KEYS, MAX_WEBHOOKS, MAX_PROVIDERS, MAX_WORKER_KEYS = 5, 60, 8, 4, 3, 4
LINES = 440  # about 66 KB a file
FILE_BYTES = len(jsonl(*(f"{0:02}-{i:04}" for i in range(LINES))))
QUOTA = 6 * FILE_BYTES + FILE_BYTES // 2


@pytest.fixture(scope="module")
async def gateways(connection: ConnectionSettings) -> AsyncIterator[list[Gateway]]:
    async with running_gateways(connection, max_active_batches=ACTIVE_LIMIT, storage_quota_bytes=QUOTA,
                                control_call_burst=BURST, control_calls_per_s=0.001,
                                max_keys_per_user=MAX_KEYS, max_webhooks_per_owner=MAX_WEBHOOKS,
                                max_providers_per_user=MAX_PROVIDERS,
                                max_worker_keys_per_provider=MAX_WORKER_KEYS) as pair:
        yield pair


async def keys_of_one_user(gateway: Gateway, count: int) -> list[Headers]:
    """`count` keys of a new user, waited for in the read model."""
    user_id, raws = f"user-{secrets.token_hex(6)}", [new_api_key(False) for _ in range(count)]
    for raw in raws:
        key_id = new_key_id()
        await gateway.bus.publish(KeyCreated(aggregate_id=key_id, key_id=key_id, key_sha256=hash_api_key(raw),
                                             role="user", label="test", user_id=user_id))
    read_model = gateway.client.app[DEPS].read_model
    for raw in raws:
        assert await read_model.wait_for(lambda r=raw: read_model.get_api_key(hash_api_key(r)), lambda r: True,
                                         WAIT_S) is not None
    return [{"Authorization": f"Bearer {raw}"} for raw in raws]


async def test_30_concurrent_creates_over_5_keys_and_2_gateways_never_pass_the_active_limit(
        gateways: list[Gateway]) -> None:
    keys = await keys_of_one_user(gateways[0], 5)
    uploaded = await gateways[0].upload(keys[0], jsonl("active"))
    assert uploaded.status == 200, await uploaded.text()
    file_id = (await uploaded.json())["id"]

    answers = await asyncio.gather(*(gateways[n % 2].client.post("/v1/batches", headers=keys[n % 5], json={
        "input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h",
        "metadata": {"n": str(n)}}) for n in range(30)))

    statuses = sorted(a.status for a in answers)
    assert statuses == [200] * ACTIVE_LIMIT + [429] * (30 - ACTIVE_LIMIT)
    listed = await gateways[1].client.get("/v1/batches?limit=100", headers=keys[4])
    assert len((await listed.json())["data"]) == ACTIVE_LIMIT


async def test_a_create_reads_the_owners_live_list_once_and_a_twin_at_the_limit_is_still_the_answer(
        gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch) -> None:
    keys = await keys_of_one_user(gateways[0], 1)
    uploaded = await gateways[0].upload(keys[0], jsonl("twin-at-limit"))
    assert uploaded.status == 200, await uploaded.text()
    bodies = [{"input_file_id": (await uploaded.json())["id"], "endpoint": "/v1/chat/completions",
               "completion_window": "24h", "metadata": {"n": str(n)}} for n in range(ACTIVE_LIMIT)]
    read_model, reads = gateways[0].client.app[DEPS].read_model, [0]
    read_live_list = read_model._live_list

    async def counted(owner: str) -> dict[str, str] | None:
        reads[0] += 1
        return await read_live_list(owner)

    monkeypatch.setattr(read_model, "_live_list", counted)
    created = [await gateways[0].client.post("/v1/batches", headers=keys[0], json=body) for body in bodies]
    assert [answer.status for answer in created] == [200] * ACTIVE_LIMIT
    assert reads[0] == ACTIVE_LIMIT  # its twin check and its limit share one read

    again = await gateways[1].client.post("/v1/batches", headers=keys[0], json=bodies[0])  # a blind retry
    assert again.status == 200, await again.text()
    first = (await created[0].json())["id"]
    assert (await again.json())["id"] == first and again.headers["X-Sheshnag-Deduplicated-From"] == first


async def test_12_concurrent_uploads_over_2_gateways_never_store_past_the_quota(gateways: list[Gateway]) -> None:
    keys = await keys_of_one_user(gateways[0], 3)

    answers = await asyncio.gather(*(gateways[n % 2].upload(keys[n % 3], jsonl(*(f"{n:02}-{i:04}"
                                                                                 for i in range(LINES))))
                                     for n in range(12)))

    statuses = sorted(a.status for a in answers)
    assert statuses == [200] * 6 + [400] * 6, statuses
    listed = await gateways[1].client.get("/v1/files", headers=keys[0])
    stored = sum(f["bytes"] for f in (await listed.json())["data"])
    assert stored == 6 * FILE_BYTES <= QUOTA


async def test_a_deleted_file_frees_its_bytes_at_once(gateways: list[Gateway]) -> None:
    [key] = await keys_of_one_user(gateways[0], 1)
    files = [await gateways[0].upload(key, jsonl(*(f"{n:02}-{i:04}" for i in range(LINES)))) for n in range(6)]
    assert [f.status for f in files] == [200] * 6
    assert (await gateways[1].upload(key, jsonl(*(f"{6:02}-{i:04}" for i in range(LINES))))).status == 400

    deleted = await gateways[1].client.delete(f"/v1/files/{(await files[0].json())['id']}", headers=key)

    assert deleted.status == 200
    assert (await gateways[1].upload(key, jsonl(*(f"{6:02}-{i:04}" for i in range(LINES))))).status == 200


async def test_control_calls_of_one_user_spend_one_burst_whichever_key_makes_them(gateways: list[Gateway]) -> None:
    keys = await keys_of_one_user(gateways[0], 6)

    answers = [await gateways[n % 2].client.post("/v1/batches", json={}, headers=keys[n % 6])
               for n in range(BURST + 2)]

    assert [a.status for a in answers] == [400] * BURST + [429, 429]


async def test_150_concurrent_key_creations_of_one_user_over_2_gateways_never_pass_the_key_limit(
        gateways: list[Gateway]) -> None:
    admin, user_id = await key_of_role(gateways[0], "admin"), f"keys-{secrets.token_hex(6)}"
    assert (await gateways[0].client.post("/v1/organization/users", json={"id": user_id}, headers=admin)).status == 200
    first = await gateways[1].client.post("/v1/organization/keys", json={"user_id": user_id}, headers=admin)
    assert first.status == 200, await first.text()
    own = {"Authorization": f"Bearer {(await first.json())['value']}"}

    answers = await asyncio.gather(*(gateways[n % 2].client.post("/v1/organization/keys", json={}, headers=own)
                                     for n in range(150)))

    assert sorted(a.status for a in answers) == [200] * (MAX_KEYS - 1) + [429] * (150 - MAX_KEYS + 1)
    listed = await gateways[0].client.get("/v1/organization/keys", headers=own)
    assert len((await listed.json())["data"]) == MAX_KEYS


async def test_30_concurrent_webhook_registrations_over_3_keys_and_2_gateways_never_pass_the_owners_limit(
        gateways: list[Gateway]) -> None:
    keys = await keys_of_one_user(gateways[0], 3)

    answers = await asyncio.gather(*(gateways[n % 2].client.post("/v1/webhooks", headers=keys[n % 3], json={
        "url": f"https://93.184.216.34/hook/{n}"}) for n in range(30)))

    statuses = sorted(a.status for a in answers)
    assert statuses == [200] * MAX_WEBHOOKS + [400] * (30 - MAX_WEBHOOKS), statuses
    assert {(await a.json())["error"]["code"] for a in answers if a.status == 400} == {"too_many_webhooks"}
    listed = await gateways[1].client.get("/v1/webhooks", headers=keys[2])
    assert len((await listed.json())["data"]) == MAX_WEBHOOKS


async def test_20_concurrent_provider_registrations_of_one_user_over_2_gateways_never_pass_the_limit(
        gateways: list[Gateway]) -> None:
    keys = await keys_of_one_user(gateways[0], 2)

    answers = await asyncio.gather(*(gateways[n % 2].client.post("/v1/provider/providers", headers=keys[n % 2], json={
        "name": f"rack {n}"}) for n in range(20)))

    statuses = sorted(a.status for a in answers)
    assert statuses == [200] * MAX_PROVIDERS + [429] * (20 - MAX_PROVIDERS), statuses
    assert {(await a.json())["error"]["code"] for a in answers if a.status == 429} == {"too_many_providers"}
    listed = await gateways[1].client.get("/v1/provider/providers", headers=keys[1])
    assert len((await listed.json())["data"]) == MAX_PROVIDERS
    [other] = await keys_of_one_user(gateways[0], 1)  # the limit is each user's own
    assert (await gateways[1].client.post("/v1/provider/providers", headers=other, json={"name": "x"})).status == 200


async def test_a_providers_worker_keys_stop_at_the_limit_and_a_revoked_one_gives_its_place_back(
        gateways: list[Gateway]) -> None:
    [key] = await keys_of_one_user(gateways[0], 1)
    registered = await gateways[0].client.post("/v1/provider/providers", headers=key, json={"name": "keys"})
    assert registered.status == 200, await registered.text()
    path = f"/v1/provider/providers/{(await registered.json())['id']}/worker_keys"

    answers = await asyncio.gather(*(gateways[n % 2].client.post(path, headers=key, json={"name": f"host {n}"})
                                     for n in range(20)))

    statuses = sorted(a.status for a in answers)
    assert statuses == [200] * MAX_WORKER_KEYS + [429] * (20 - MAX_WORKER_KEYS), statuses
    assert {(await a.json())["error"]["code"] for a in answers if a.status == 429} == {"too_many_keys"}
    made = [(await a.json())["id"] for a in answers if a.status == 200]
    assert (await gateways[1].client.delete(f"{path}/{made[0]}", headers=key)).status == 200
    again = await gateways[1].client.post(path, headers=key, json={"name": "replacement"})
    assert again.status == 200, await again.text()
    assert (await gateways[0].client.post(path, headers=key, json={"name": "one more"})).status == 429


@pytest.fixture(scope="module")
def gateway_processes(gateways: list[Gateway], connection: ConnectionSettings) -> Iterator[list[str]]:
    """Two more gateways, each its own process as a deployment runs them (the same limits), on the same broker."""
    limits = {"max_active_batches": str(ACTIVE_LIMIT), "storage_quota_bytes": str(QUOTA),
              "control_call_burst": str(BURST), "control_calls_per_s": "0.001", "auth_failure_limit": "0"}
    started: list[subprocess.Popen[bytes]] = []
    try:
        bases = []
        for _ in range(2):
            process, base = gateway_process(connection, **limits)
            started.append(process)
            bases.append(base)
        yield bases
    finally:
        for process in started:
            process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(10)


async def test_30_creates_and_12_uploads_racing_over_two_gateway_processes_never_pass_the_limits(
        gateways: list[Gateway], gateway_processes: list[str]) -> None:
    keys = await keys_of_one_user(gateways[0], 5)
    async with aiohttp.ClientSession() as http:
        async def upload(n: int) -> int:
            form = aiohttp.FormData()
            form.add_field("purpose", "batch")
            form.add_field("file", jsonl(*(f"{n:02}-{i:04}" for i in range(LINES))), filename="in.jsonl")
            async with http.post(f"{gateway_processes[n % 2]}/v1/files", data=form, headers=keys[n % 5]) as answer:
                return answer.status

        uploads = sorted(await asyncio.gather(*(upload(n) for n in range(12))))
        async with http.get(f"{gateway_processes[0]}/v1/files?limit=100", headers=keys[0]) as listed:
            files = (await listed.json())["data"]

        async def create(n: int) -> int:
            async with http.post(f"{gateway_processes[n % 2]}/v1/batches", headers=keys[n % 5], json={
                    "input_file_id": files[0]["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h",
                    "metadata": {"n": str(n)}}) as answer:
                return answer.status

        creates = sorted(await asyncio.gather(*(create(n) for n in range(30))))
        async with http.get(f"{gateway_processes[1]}/v1/batches?limit=100", headers=keys[3]) as listed:
            batches = (await listed.json())["data"]

    assert uploads == [200] * 6 + [400] * 6
    assert sum(f["bytes"] for f in files) == 6 * FILE_BYTES <= QUOTA
    assert creates == [200] * ACTIVE_LIMIT + [429] * (30 - ACTIVE_LIMIT)
    assert len(batches) == ACTIVE_LIMIT


async def test_a_deleted_webhook_gives_its_place_back_at_once(gateways: list[Gateway]) -> None:
    [key] = await keys_of_one_user(gateways[0], 1)
    made = [await gateways[n % 2].client.post("/v1/webhooks", headers=key, json={
        "url": f"https://93.184.216.34/hook/{n}"}) for n in range(MAX_WEBHOOKS)]
    assert [m.status for m in made] == [200] * MAX_WEBHOOKS

    for round_ in range(3):
        deleted = await gateways[round_ % 2].client.delete(f"/v1/webhooks/{(await made[round_].json())['id']}",
                                                           headers=key)
        assert deleted.status == 200
        again = await gateways[(round_ + 1) % 2].client.post("/v1/webhooks", headers=key, json={
            "url": f"https://93.184.216.34/again/{round_}"})
        assert again.status == 200, await again.text()
    over = await gateways[0].client.post("/v1/webhooks", headers=key, json={"url": "https://93.184.216.34/over"})
    assert over.status == 400
