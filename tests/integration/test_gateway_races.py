"""The gateway under steady, concurrent use against a real broker, S3 and ledger: lists stay complete and leave
nothing behind, a create and a delete of one file never both win, and only an identical create is a twin."""

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
from aiohttp import ClientResponse

from contracts.api.batch import BatchUsage
from contracts.events.batch import BatchCancelRequested, BatchExpired, BatchFinalizing, BatchReleased
from contracts.events.envelope import Event
from contracts.subjects import READ_MODEL_BUCKET
from services.gateway.context import DEPS
from services.runtime.nats.bus import Fence
from services.runtime.process.settings import ConnectionSettings
from tests.integration.gateway_support import Gateway, jsonl, running_gateway


@pytest.fixture(scope="module")
async def gateway(connection: ConnectionSettings) -> AsyncIterator[Gateway]:
    async with running_gateway(connection, max_active_batches=200, control_call_burst=10_000,
                               control_calls_per_s=1000) as running:
        yield running


def body(file_id: str, **extra: object) -> dict[str, object]:
    return {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h", **extra}


async def upload(gateway: Gateway, key: dict[str, str], tag: str, filename: str = "in.jsonl") -> str:
    response = await gateway.upload(key, jsonl(tag), filename=filename)
    assert response.status == 200, await response.text()
    return str((await response.json())["id"])


async def read_model_consumers(gateway: Gateway) -> int:
    return (await gateway.bus.js.stream_info(f"KV_{READ_MODEL_BUCKET}")).state.consumer_count


async def test_lists_under_concurrent_polling_are_complete_and_leave_no_consumer_behind(gateway: Gateway) -> None:
    key = await gateway.new_key()
    files = [await upload(gateway, key, f"list-{i}") for i in range(12)]
    for file_id in files:
        assert (await gateway.client.post("/v1/batches", json=body(file_id, hold=True), headers=key)).status == 200
    consumers_before = await read_model_consumers(gateway)

    async def poll(path: str) -> list[int]:
        sizes = []
        for _ in range(25):
            response = await gateway.client.get(path, headers=key)
            assert response.status == 200
            sizes.append(len((await response.json())["data"]))
        return sizes

    results = await asyncio.gather(*(poll(path) for path in ["/v1/batches?limit=100", "/v1/files"] * 5))

    assert all(sizes == [12] * 25 for sizes in results)
    assert await read_model_consumers(gateway) <= consumers_before


async def test_a_cursor_walk_visits_every_batch_once(gateway: Gateway) -> None:
    key = await gateway.new_key()
    created = set()
    for i in range(7):
        response = await gateway.client.post("/v1/batches", json=body(await upload(gateway, key, f"walk-{i}")),
                                             headers=key)
        created.add((await response.json())["id"])
    seen: list[str] = []
    after = ""
    while True:
        page = await (await gateway.client.get(f"/v1/batches?limit=2{after}", headers=key)).json()
        seen += [b["id"] for b in page["data"]]
        if not page["has_more"]:
            break
        after = f"&after={page['data'][-1]['id']}"
    assert sorted(seen) == sorted(created)


async def test_a_held_batchs_input_file_cannot_be_deleted_while_lists_are_polled(gateway: Gateway) -> None:
    key = await gateway.new_key()
    file_id = await upload(gateway, key, "held")
    assert (await gateway.client.post("/v1/batches", json=body(file_id, hold=True), headers=key)).status == 200
    polls = [gateway.client.get("/v1/batches", headers=key) for _ in range(20)]
    deletes = [gateway.client.delete(f"/v1/files/{file_id}", headers=key) for _ in range(10)]

    answers = await asyncio.gather(*polls, *deletes)

    assert [r.status for r in answers[20:]] == [409] * 10
    assert (await gateway.client.get(f"/v1/files/{file_id}", headers=key)).status == 200


async def test_a_create_and_a_delete_racing_on_one_file_never_both_win(gateway: Gateway) -> None:
    key = await gateway.new_key()
    outcomes = set()
    for round_ in range(15):
        file_id = await upload(gateway, key, f"race-{round_}")
        create, delete = await asyncio.gather(
            gateway.client.post("/v1/batches", json=body(file_id), headers=key),
            gateway.client.delete(f"/v1/files/{file_id}", headers=key))
        outcomes.add((create.status, delete.status))
        file_there = (await gateway.client.get(f"/v1/files/{file_id}", headers=key)).status
        if create.status == 200:
            assert delete.status == 409 and file_there == 200
        else:
            assert (create.status, delete.status, file_there) == (404, 200, 404)
    assert outcomes <= {(200, 409), (404, 200)}


@pytest.mark.parametrize("difference", [
    {"metadata": {"run": "2"}}, {"hold": True}, {"allow_partial": True},
    {"output_expires_after": {"anchor": "created_at", "seconds": 7200}},
])
async def test_a_create_that_differs_in_any_parameter_is_a_batch_of_its_own(gateway: Gateway,
                                                                            difference: dict[str, object]) -> None:
    key = await gateway.new_key()
    file_id = await upload(gateway, key, "twin")
    first = await gateway.client.post("/v1/batches", json=body(file_id, metadata={"run": "1"}), headers=key)
    other = await gateway.client.post("/v1/batches", json=body(file_id, **{"metadata": {"run": "1"}, **difference}),
                                      headers=key)
    assert other.status == 200
    assert (await other.json())["id"] != (await first.json())["id"]
    assert "X-Sheshnag-Deduplicated-From" not in other.headers


async def test_an_identical_create_while_the_first_lives_returns_the_first_and_says_so(gateway: Gateway) -> None:
    key = await gateway.new_key()
    file_id = await upload(gateway, key, "same")
    first = await (await gateway.client.post("/v1/batches", json=body(file_id, hold=True), headers=key)).json()
    again = await gateway.client.post("/v1/batches", json=body(file_id, hold=True), headers=key)
    assert (await again.json())["id"] == first["id"]
    assert again.headers["X-Sheshnag-Deduplicated-From"] == first["id"]


async def test_an_identical_create_after_a_cancel_is_a_new_batch_cancel_and_resubmit(gateway: Gateway) -> None:
    key = await gateway.new_key()
    file_id = await upload(gateway, key, "resubmitted")
    first = await (await gateway.client.post("/v1/batches", json=body(file_id, hold=True), headers=key)).json()
    assert (await gateway.client.post(f"/v1/batches/{first['id']}/cancel", headers=key)).status == 200

    again = await gateway.client.post("/v1/batches", json=body(file_id, hold=True), headers=key)

    assert again.status == 200, await again.text()
    resubmitted = await again.json()
    assert resubmitted["id"] != first["id"] and resubmitted["status"] not in ("cancelling", "cancelled")
    assert "X-Sheshnag-Deduplicated-From" not in again.headers


async def test_identical_bytes_under_another_filename_keep_a_file_object_of_their_own(gateway: Gateway) -> None:
    key = await gateway.new_key()
    first = await upload(gateway, key, "bytes", filename="a.jsonl")
    second = await gateway.upload(key, jsonl("bytes"), filename="b.jsonl")
    assert "X-Sheshnag-Deduplicated-From" not in second.headers
    copy = await second.json()
    assert copy["id"] != first and copy["filename"] == "b.jsonl"
    assert (await gateway.client.delete(f"/v1/files/{first}", headers=key)).status == 200
    content = await gateway.client.get(f"/v1/files/{copy['id']}/content", headers=key)
    assert await content.read() == jsonl("bytes")


async def test_a_cancel_after_the_finalizer_began_is_refused_even_before_the_read_model_shows_it(
        gateway: Gateway) -> None:
    key = await gateway.new_key()
    file_id = await upload(gateway, key, "finalizing")
    batch = await (await gateway.client.post("/v1/batches", json=body(file_id, hold=True), headers=key)).json()
    await gateway.bus.publish(BatchFinalizing(aggregate_id=batch["id"], correlation_id=batch["id"], attempt=1))

    cancel = await gateway.client.post(f"/v1/batches/{batch['id']}/cancel", headers=key)

    assert cancel.status == 400
    assert (await cancel.json())["error"]["code"] == "batch_not_cancellable"


async def test_a_cancel_of_a_batch_that_ended_before_the_cancel_reached_its_log_is_refused(gateway: Gateway) -> None:
    key = await gateway.new_key()
    file_id = await upload(gateway, key, "expired")
    batch = await (await gateway.client.post("/v1/batches", json=body(file_id, hold=True), headers=key)).json()
    await gateway.bus.publish(BatchExpired(aggregate_id=batch["id"], correlation_id=batch["id"], output_file_id=None,
                                           error_file_id=None, completed=0, failed=0, usage=BatchUsage()))

    cancel = await gateway.client.post(f"/v1/batches/{batch['id']}/cancel", headers=key)

    assert cancel.status == 400
    assert (await cancel.json())["error"]["code"] == "batch_not_cancellable"


async def test_an_accepted_cancel_answers_cancelling_with_its_time_even_when_it_answers_before_the_ledger(
        connection: ConnectionSettings) -> None:
    async with running_gateway(connection, read_your_writes_s=0.0, control_call_burst=1000) as hasty:
        key = await hasty.new_key()
        file_id = await upload(hasty, key, "hasty-cancel")
        for round_ in range(10):
            created = await hasty.client.post("/v1/batches", json=body(file_id, metadata={"round": str(round_)}),
                                              headers=key)
            batch_id = (await created.json())["id"]

            cancel = await hasty.client.post(f"/v1/batches/{batch_id}/cancel", headers=key)

            assert cancel.status == 200, await cancel.text()
            answer = await cancel.json()
            assert answer["status"] == "cancelling" and answer["cancelling_at"] is not None, answer


async def test_a_list_shows_the_callers_own_creates_and_deletes_even_when_they_answered_before_the_ledger(
        connection: ConnectionSettings) -> None:
    async with running_gateway(connection, read_your_writes_s=0.0, control_call_burst=1000) as hasty:
        key = await hasty.new_key()
        for round_ in range(10):
            file_id = await upload(hasty, key, f"hasty-{round_}")
            created = await (await hasty.client.post("/v1/batches", json=body(file_id), headers=key)).json()
            batches = await (await hasty.client.get("/v1/batches", headers=key)).json()
            assert created["id"] in [b["id"] for b in batches["data"]]
            spare = await upload(hasty, key, f"spare-{round_}")
            assert (await hasty.client.delete(f"/v1/files/{spare}", headers=key)).status == 200
            files = [f["id"] for f in (await (await hasty.client.get("/v1/files", headers=key)).json())["data"]]
            assert file_id in files and spare not in files


async def release_after(gateway: Gateway, tag: str, first: Callable[[str], Event]) -> ClientResponse:
    """Release a held batch of a new owner, `first(batch id)` reaching the log between the release's check and its
    fact."""
    key = await gateway.new_key()
    file_id = await upload(gateway, key, tag)
    batch = await (await gateway.client.post("/v1/batches", json=body(file_id, hold=True), headers=key)).json()
    bus = gateway.client.app[DEPS].bus
    publish = bus.publish

    async def overtaken(event: Event, fence: Fence | None = None) -> int:
        if isinstance(event, BatchReleased):
            await publish(first(batch["id"]))
        return await publish(event, fence)

    bus.publish = overtaken
    try:
        return await gateway.client.post(f"/v1/batches/{batch['id']}/release", headers=key)
    finally:
        bus.publish = publish


async def test_a_release_that_a_batchs_end_overtook_is_refused_not_answered_as_released(gateway: Gateway) -> None:
    release = await release_after(gateway, "released-late", lambda batch_id: BatchExpired(
        aggregate_id=batch_id, output_file_id=None, error_file_id=None, completed=0, failed=0, usage=BatchUsage()))

    assert release.status == 400, await release.text()
    assert (await release.json())["error"]["code"] == "batch_not_releasable"


async def test_a_release_after_a_cancel_reached_the_log_is_taken_as_the_ledger_takes_it(gateway: Gateway) -> None:
    """A cancelling batch still takes a release (it ends cancelled all the same): the answer says it was released."""
    release = await release_after(gateway, "released-cancelling", lambda batch_id: BatchCancelRequested(
        aggregate_id=batch_id, requested_by_key_id="key_owner"))

    assert release.status == 200, await release.text()
    assert (await release.json())["held"] is None
