"""`GET /v1/batches?status=&search=` (extensions the dashboard pages with): one status, and text found in a batch's
id or metadata (`key=value` for one pair), each page still cursor-paged, against a real gateway, ledger and NATS."""

from collections.abc import AsyncIterator

import pytest

from services.runtime.process.settings import ConnectionSettings
from tests.integration.gateway_support import Gateway, jsonl, running_gateway
from tests.integration.test_gateway_accounts import admin_key
from tests.integration.test_gateway_oversight import member, organization

CHAT_BATCH = {"endpoint": "/v1/chat/completions", "completion_window": "24h"}


@pytest.fixture(scope="module")
async def gateway(connection: ConnectionSettings) -> AsyncIterator[Gateway]:
    async with running_gateway(connection) as running:
        yield running


async def test_a_list_filters_by_status_and_searches_metadata_page_by_page(gateway: Gateway) -> None:
    admin = await admin_key(gateway)
    _, erin = await member(gateway, admin, await organization(gateway, admin), "erin")
    made = []
    for n, team in enumerate(["nlp", "vision", "nlp"]):
        file = await (await gateway.upload(erin, jsonl(f"f{n}"))).json()
        created = await gateway.client.post("/v1/batches", headers=erin, json={
            "input_file_id": file["id"], **CHAT_BATCH, "metadata": {"team": team, "run": f"nightly-{n}"}})
        assert created.status == 200, await created.text()
        made.append((await created.json())["id"])

    async def ids(**query: str) -> list[str]:
        page = await (await gateway.client.get("/v1/batches", params=query, headers=erin)).json()
        return [batch["id"] for batch in page["data"]]

    assert sorted(await ids(search="team=nlp")) == sorted([made[0], made[2]])
    assert await ids(search="VISION") == [made[1]]
    assert await ids(search="nightly-2") == [made[2]]
    assert await ids(search=made[1][-8:]) == [made[1]]
    assert sorted(await ids(status="validating")) == sorted(made)  # no validator here: they stay validating
    assert await ids(status="completed") == []
    first = await ids(search="team=nlp", limit="1")
    second = await ids(search="team=nlp", limit="1", after=first[0])
    assert len(first) == len(second) == 1 and {*first, *second} == {made[0], made[2]}
    refused = await gateway.client.get("/v1/batches", params={"status": "done"}, headers=erin)
    assert refused.status == 400 and (await refused.json())["error"]["code"] == "invalid_status"
