"""Guesses of a guessable key sent at once from one address are looked up no more than the address's budget allows:
each takes its failure before it is looked up (the limit was once read, then the key looked up, then the failure
recorded, so 80 guesses sent together were all looked up against a budget of 10)."""

import asyncio

import pytest

from services.gateway.adapters.key_cache import KeyCache
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
