"""An owner's storage quota counts every byte stored for them: uploads, the result files their batches leave (here,
the error file of a cancelled batch) and the copies `POST /v1/batches/{id}/retry` makes. Concurrent retries with
different codes, each a new copy, never store past it.

The services run in this process on a broker of their own (a scheduler here must be the only one on its broker);
no executor runs, so a batch waits until it is cancelled and every line goes to its error file."""

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import pytest

from contracts.ids import derived_id, owner_id
from contracts.subjects import input_object_key
from infra.embedded import free_port, start_nats, stop_process
from services.gateway.context import DEPS
from services.runtime.process.settings import ConnectionSettings
from services.runtime.process.tasks import cancel_and_join
from services.scheduler.app import run_scheduler
from services.scheduler.settings import SchedulerSettings
from services.validator.app import run_validator
from services.validator.settings import ValidatorSettings
from tests.conftest import RunningS3
from tests.integration.gateway_pair import Headers, running_gateways
from tests.integration.gateway_support import WAIT_S, Gateway, jsonl

LINES = 40
FILE = jsonl(*(f"line-{i:03}" for i in range(LINES)))
QUOTA = 4 * len(FILE)
"""Room for the input, its error file (each line's id and code: smaller than the input) and one copy, not two."""
TERMINAL = {"completed", "failed", "expired", "cancelled"}


@pytest.fixture(scope="module")
async def gateways(tmp_path_factory: pytest.TempPathFactory, s3_server: RunningS3) -> AsyncIterator[list[Gateway]]:
    data = tmp_path_factory.mktemp("quota")
    port = free_port()
    nats_process = start_nats(data, port, data / "nats.log")
    connection = ConnectionSettings(nats_url=f"nats://127.0.0.1:{port}", s3_endpoint=s3_server.endpoint,
                                    s3_access_key=s3_server.credentials.access_key,
                                    s3_secret_key=s3_server.credentials.secret_key, s3_bucket="sheshnag-quota")
    stop = asyncio.Event()
    try:
        async with running_gateways(connection, storage_quota_bytes=QUOTA) as pair:
            tasks = [asyncio.create_task(run_validator(ValidatorSettings(connection=connection), stop)),
                     asyncio.create_task(run_scheduler(SchedulerSettings(connection=connection, tick_s=0.2), stop))]
            try:
                yield pair
            finally:
                stop.set()
                _, running = await asyncio.wait(tasks, timeout=WAIT_S)
                await cancel_and_join(list(running))  # a service slow to stop cleanly holds up no other test
    finally:
        with contextlib.suppress(Exception):
            stop_process(nats_process)


async def stored_bytes(gateway: Gateway, key: Headers) -> int:
    listed = await gateway.client.get("/v1/files?limit=10000", headers=key)
    assert listed.status == 200, await listed.text()
    return sum(f["bytes"] for f in (await listed.json())["data"])


async def cancelled_batch(gateway: Gateway, key: Headers) -> dict[str, object]:
    """A batch of FILE, validated, then cancelled before any executor ran a line: all in its error file."""
    uploaded = await gateway.upload(key, FILE)
    assert uploaded.status == 200, await uploaded.text()
    created = await gateway.client.post("/v1/batches", headers=key, json={
        "input_file_id": (await uploaded.json())["id"], "endpoint": "/v1/chat/completions",
        "completion_window": "24h"})
    assert created.status == 200, await created.text()
    batch_id = (await created.json())["id"]
    for _ in range(int(WAIT_S * 10)):
        batch = await (await gateway.client.get(f"/v1/batches/{batch_id}", headers=key)).json()
        if batch["status"] not in ("validating",):
            break
        await asyncio.sleep(0.1)
    cancelled = await gateway.client.post(f"/v1/batches/{batch_id}/cancel", headers=key)
    assert cancelled.status == 200, await cancelled.text()
    for _ in range(int(WAIT_S * 10)):
        batch = await (await gateway.client.get(f"/v1/batches/{batch_id}", headers=key)).json()
        if batch["status"] in TERMINAL:
            break
        await asyncio.sleep(0.1)
    assert batch["status"] == "cancelled" and batch["error_file_id"], batch
    return dict(batch)


async def test_the_error_file_of_a_batch_counts_against_its_owners_quota(gateways: list[Gateway]) -> None:
    key = await gateways[0].new_key()
    batch = await cancelled_batch(gateways[0], key)
    error_file = await (await gateways[0].client.get(f"/v1/files/{batch['error_file_id']}", headers=key)).json()
    assert error_file["bytes"] > 0
    room_without_it = QUOTA - len(FILE)
    filler = jsonl(*(f"f{i:05}" for i in range(10_000)))[:room_without_it - error_file["bytes"] // 2]
    filler = filler[:filler.rfind(b"\n") + 1]  # fits beside the input, not beside the input and the error file

    refused = await gateways[1].upload(key, filler)

    assert refused.status == 400 and (await refused.json())["error"]["code"] == "storage_quota_exceeded"
    assert await stored_bytes(gateways[1], key) == len(FILE) + error_file["bytes"]


async def test_eight_concurrent_retries_with_different_codes_never_store_past_the_quota(
        gateways: list[Gateway]) -> None:
    key = await gateways[0].new_key()
    batch = await cancelled_batch(gateways[0], key)
    before = await stored_bytes(gateways[0], key)
    assert before + len(FILE) <= QUOTA < before + 2 * len(FILE)

    async def retry(n: int) -> aiohttp.ClientResponse:
        """As a client does: a 503 (the broker too slow to decide the limit now) is asked again."""
        for _ in range(5):
            answer = await gateways[n % 2].client.post(f"/v1/batches/{batch['id']}/retry", headers=key,
                                                       json={"codes": ["batch_cancelled", f"code_{n}"]})
            if answer.status != 503:
                return answer
            await asyncio.sleep(1)
        return answer

    answers = await asyncio.gather(*(retry(n) for n in range(8)))

    statuses = sorted(a.status for a in answers)
    assert statuses == [200] + [400] * 7, statuses
    refusals = [(await a.json())["error"]["code"] for a in answers if a.status == 400]
    assert refusals == ["storage_quota_exceeded"] * 7
    assert await stored_bytes(gateways[1], key) == before + len(FILE) <= QUOTA
    me = await (await gateways[0].client.get("/v1/me", headers=key)).json()
    owner = owner_id(me["user_id"], me["key_id"])
    copies = [derived_id("file-", owner, f"retry:{batch['id']}:batch_cancelled,code_{n}") for n in range(8)]
    store = gateways[0].client.app[DEPS].store
    assert [bool(await store.list_keys(input_object_key(c))) for c in copies].count(True) == 1, \
        "a refused copy's object is removed"



async def test_the_same_retry_asked_twice_at_once_makes_one_batch_whose_input_stays(gateways: list[Gateway]) -> None:
    """Both requests copy the same lines; the quota has room for one copy. The one stated is the retry of both, and
    the other request removes only its own copy (it once removed the shared object the retry batch reads)."""
    for round_ in range(4):
        key = await gateways[0].new_key()
        batch = await cancelled_batch(gateways[0], key)

        async def retry(n: int, batch_id: object = batch["id"], key: Headers = key,
                        lag_s: float = 0.005 * (round_ + 1)) -> aiohttp.ClientResponse:
            await asyncio.sleep(lag_s * n)
            return await gateways[n].client.post(f"/v1/batches/{batch_id}/retry", headers=key,
                                                 json={"codes": ["batch_cancelled"]})

        answers = await asyncio.gather(retry(0), retry(1))

        assert [a.status for a in answers] == [200, 200], [await a.text() for a in answers]
        [made] = {(await a.json())["id"] for a in answers}
        for _ in range(int(WAIT_S * 10)):
            retried = await (await gateways[0].client.get(f"/v1/batches/{made}", headers=key)).json()
            if retried["status"] != "validating":
                break
            await asyncio.sleep(0.1)
        assert retried["status"] != "failed", retried
        content = await gateways[1].client.get(f"/v1/files/{retried['input_file_id']}/content", headers=key)
        assert content.status == 200 and (await content.read()).count(b"\n") == LINES
        store = gateways[0].client.app[DEPS].store
        assert len(await store.list_keys(input_object_key(retried["input_file_id"]))) == 1, "the other copy is gone"
