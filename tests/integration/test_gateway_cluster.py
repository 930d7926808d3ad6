"""Two gateways on one broker, clients alternating between them: every limit is the deployment's, not a
process's. Control calls spend one bucket per key, guesses from an address trip one brute-force budget (right keys
still work at both), and active batches count against one limit, exactly as through one gateway."""

import secrets
from collections.abc import AsyncIterator

import pytest

from contracts.ids import new_api_key
from services.gateway.http.auth_failures import AUTH_FAILURES
from services.runtime.process.settings import ConnectionSettings
from tests.integration.gateway_pair import Headers, client_from, key_of_role, own_address, running_gateways, url_of
from tests.integration.gateway_support import Gateway, jsonl

BURST, AUTH_LIMIT, AUTH_WINDOW_S, ACTIVE_LIMIT = 10, 5, 30.0, 3


@pytest.fixture(scope="module")
async def gateways(connection: ConnectionSettings) -> AsyncIterator[list[Gateway]]:
    async with running_gateways(connection, control_call_burst=BURST, control_calls_per_s=0.001,
                                auth_failure_limit=AUTH_LIMIT, auth_failure_window_s=AUTH_WINDOW_S,
                                max_active_batches=ACTIVE_LIMIT) as pair:
        yield pair


def guessable() -> str:
    return f"gk-{secrets.token_hex(16)}"  # not the generated shape


def bearer(key: str) -> Headers:
    return {"Authorization": f"Bearer {key}"}


async def test_control_calls_alternating_over_two_gateways_spend_one_burst(gateways: list[Gateway]) -> None:
    key = await key_of_role(gateways[0])

    answers = [await gateways[n % 2].client.post("/v1/batches", json={}, headers=key) for n in range(BURST + 2)]

    assert [a.status for a in answers] == [400] * BURST + [429, 429]
    assert [(await a.json())["error"]["code"] for a in answers[BURST:]] == ["rate_limit_exceeded"] * 2


async def test_guesses_spread_over_two_gateways_trip_one_budget_and_right_keys_still_work_at_both(
        gateways: list[Gateway]) -> None:
    weak_admin = await key_of_role(gateways[0], "admin", guessable())
    generated = await key_of_role(gateways[0])
    unused_weak = await key_of_role(gateways[0], "user", guessable())
    address = own_address()
    async with client_from(address) as http:

        async def status(gateway: Gateway, key: Headers) -> int:
            async with http.get(url_of(gateway, "/v1/models"), headers=key) as answer:
                return answer.status

        assert await status(gateways[0], weak_admin) == 200  # it succeeded from here (at the first) before

        guesses = [await status(gateways[n % 2], bearer(guessable())) for n in range(2 * AUTH_LIMIT)]

        assert guesses == [401] * (AUTH_LIMIT - 1) + [429] * (AUTH_LIMIT + 1)
        for gateway in gateways:
            assert await status(gateway, bearer(new_api_key(False))) == 429
            assert await status(gateway, generated) == 200
            assert await status(gateway, weak_admin) == 200
            assert await status(gateway, unused_weak) == 429  # first use mid-guessing, at either
    failures = gateways[1].client.app[AUTH_FAILURES]
    counted = await failures.store.read(failures.entry("auth", address))
    assert counted is not None and len(counted) == AUTH_LIMIT, "one list for the address, kept to the limit"


async def test_active_batches_created_through_either_gateway_count_against_one_limit(
        gateways: list[Gateway]) -> None:
    key = await key_of_role(gateways[0])
    files = []
    for n in range(ACTIVE_LIMIT + 1):
        uploaded = await gateways[n % 2].upload(key, jsonl(f"active-{n}"))
        assert uploaded.status == 200, await uploaded.text()
        files.append((await uploaded.json())["id"])

    created = [await gateways[n % 2].client.post("/v1/batches", headers=key, json={
        "input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h", "hold": True})
        for n, file_id in enumerate(files)]

    assert [c.status for c in created] == [200] * ACTIVE_LIMIT + [429]
    assert (await created[-1].json())["error"]["code"] == "too_many_active_batches"
