"""Guesses of a guessable key sent at once from one address are looked up no more than the address's budget allows:
each takes its failure before it is looked up (the limit was once read, then the key looked up, then the failure
recorded, so 80 guesses sent together were all looked up against a budget of 10)."""

import asyncio
import secrets

import pytest

from contracts.events.key import KeyCreated
from contracts.ids import hash_api_key
from services.gateway.adapters.key_cache import KeyCache
from services.gateway.context import DEPS
from services.gateway.usecases.refusals import ApiError
from services.runtime.process.settings import ConnectionSettings
from tests.integration.gateway_support import running_gateway

LIMIT = 10
GUESSES = 80


async def test_guesses_sent_at_once_are_looked_up_no_more_than_the_budget(
        connection: ConnectionSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    looked_up: list[str] = []
    lookup = KeyCache.lookup

    async def counted(self: KeyCache, api_key: str) -> object:
        if api_key.startswith("guess-"):
            looked_up.append(api_key)
        return await lookup(self, api_key)

    monkeypatch.setattr(KeyCache, "lookup", counted)
    async with running_gateway(connection, auth_failure_limit=LIMIT, auth_failure_window_s=60.0) as gateway:
        answers = await asyncio.gather(*(gateway.client.get("/v1/models", headers={
            "Authorization": f"Bearer guess-{n:04d}-weak"}) for n in range(GUESSES)))
        statuses = [answer.status for answer in answers]
    assert len(looked_up) <= LIMIT, f"{len(looked_up)} of {GUESSES} guesses looked up; statuses {statuses}"


async def test_a_guess_the_gateway_could_not_look_up_does_not_spend_the_budget(
        connection: ConnectionSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lookup that found no answer (the read model unavailable: 503) says nothing of the key: the failure it
    reserved goes back, so a client retrying through an outage is not then refused for an hour's window."""
    lookup = KeyCache.lookup
    outage = {"on": True}

    async def unavailable(self: KeyCache, api_key: str) -> object:
        if outage["on"]:
            raise ApiError(503, "The read model is unavailable.", "server_error", "unavailable")
        return await lookup(self, api_key)

    monkeypatch.setattr(KeyCache, "lookup", unavailable)
    # Another window than the test before's: its counts (shared on the broker, by limit and window) are not these.
    async with running_gateway(connection, auth_failure_limit=LIMIT, auth_failure_window_s=61.0) as gateway:
        for n in range(LIMIT + 2):
            answer = await gateway.client.get("/v1/models", headers={"Authorization": f"Bearer guess-{n:04d}-weak"})
            assert answer.status == 503, await answer.text()
        outage["on"] = False
        after = await gateway.client.get("/v1/models", headers={"Authorization": "Bearer guess-9999-weak"})
        assert after.status == 401, await after.text()


async def test_a_burst_of_one_right_guessable_key_from_a_new_address_is_let_in_whole(
        connection: ConnectionSettings) -> None:
    """Requests of the same key sent at once are checked one after another until one succeeds: the rest are then
    trusted, not each refused for a failure it reserved (a chosen admin key's burst was refused in part)."""
    key = f"gk-{secrets.token_hex(16)}"  # hex: few distinct characters, so a key the limit treats as guessable
    digest = hash_api_key(key)
    async with running_gateway(connection, auth_failure_limit=2, auth_failure_window_s=62.0) as gateway:
        await gateway.bus.publish(KeyCreated(aggregate_id=digest[:32], key_sha256=digest, role="admin", label="a"))
        read_model = gateway.client.app[DEPS].read_model
        assert await read_model.wait_for(lambda: read_model.get_api_key(digest), lambda found: True, 30) is not None
        answers = await asyncio.gather(*(gateway.client.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
                                         for _ in range(16)))
        assert [answer.status for answer in answers] == [200] * 16
