"""Creates racing over two gateways. The very same create without an Idempotency-Key, sent to both at once, makes
one batch (each used to make its own: the twin check saw only batches the read model showed). With one
Idempotency-Key but different input files one wins, the other is 409 `idempotency_conflict`, and the loser's claim on
its own file lapses as a claim whose batch never appeared does (it was once held `file_in_use` by the winner's batch,
which never reads it, until that batch ended)."""

import asyncio
import secrets
from collections.abc import AsyncIterator

import pytest

from services.gateway.usecases import files as file_usecases
from services.runtime.process.settings import ConnectionSettings
from tests.integration.gateway_pair import running_gateways
from tests.integration.gateway_support import Gateway, jsonl


@pytest.fixture(scope="module")
async def gateways(connection: ConnectionSettings) -> AsyncIterator[list[Gateway]]:
    async with running_gateways(connection, control_call_burst=1000) as pair:
        yield pair


async def test_the_very_same_create_sent_to_two_gateways_at_once_makes_one_batch(gateways: list[Gateway]) -> None:
    key = await gateways[0].new_key()
    for round_ in range(6):
        uploaded = await gateways[0].upload(key, jsonl(f"twin-{round_}-a", f"twin-{round_}-b"))
        assert uploaded.status == 200, await uploaded.text()
        body = {"input_file_id": (await uploaded.json())["id"], "endpoint": "/v1/chat/completions",
                "completion_window": "24h", "hold": True}

        answers = await asyncio.gather(*(g.client.post("/v1/batches", json=body, headers=key) for g in gateways))

        assert [a.status for a in answers] == [200, 200], [await a.text() for a in answers]
        ids = [(await a.json())["id"] for a in answers]
        assert ids[0] == ids[1]
        said = [a.headers.get("X-Sheshnag-Deduplicated-From") for a in answers]
        assert sorted(said, key=str) == sorted([None, ids[0]], key=str), "the twin says whose batch it is"
        listed = await (await gateways[round_ % 2].client.get("/v1/batches?limit=100", headers=key)).json()
        assert [b["id"] for b in listed["data"]].count(ids[0]) == 1 and len(listed["data"]) == round_ + 1


async def test_the_loser_of_an_idempotency_conflict_holds_its_file_only_a_while(gateways: list[Gateway],
                                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                                 ) -> None:
    monkeypatch.setattr(file_usecases, "CLAIM_GRACE_S", 0.5)  # as one whose batch never came, not till the other ends
    key = await gateways[0].new_key()
    for round_ in range(5):
        files = [(await (await gateways[0].upload(key, jsonl(f"idem-{round_}-{n}"))).json())["id"] for n in (0, 1)]
        headers = {**key, "Idempotency-Key": f"idem-{secrets.token_hex(12)}"}

        answers = await asyncio.gather(*(gateway.client.post("/v1/batches", headers=headers, json={
            "input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h", "hold": True})
            for gateway, file_id in zip(gateways, files, strict=True)))

        statuses = [a.status for a in answers]
        if sorted(statuses) != [200, 409]:  # one after the other: the second was refused before it claimed
            assert statuses.count(200) == 1, [await a.text() for a in answers]
        winner = files[statuses.index(200)]
        loser = files[1 - statuses.index(200)]
        await asyncio.sleep(0.6)
        deleted = await gateways[1].client.delete(f"/v1/files/{loser}", headers=key)
        assert deleted.status == 200, await deleted.text()
        in_use = await gateways[0].client.delete(f"/v1/files/{winner}", headers=key)
        assert in_use.status == 409 and (await in_use.json())["error"]["code"] == "file_in_use"
