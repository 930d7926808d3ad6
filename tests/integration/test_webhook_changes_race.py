"""Changes of one webhook endpoint racing each other: each is applied to what is stored at its write (compare-and-set),
so an update slowed by its URL's check neither undoes a secret's rotation nor brings back an endpoint deleted
meanwhile."""

import asyncio
from collections.abc import AsyncIterator

import pytest

import services.gateway.views.webhooks as views
from services.gateway.webhooks.deliverer import WEBHOOK_STORE
from services.runtime.process.settings import ConnectionSettings
from tests.integration.gateway_support import Gateway, running_gateway


@pytest.fixture(scope="module")
async def gateway(connection: ConnectionSettings) -> AsyncIterator[Gateway]:
    async with running_gateway(connection, webhook_allowed_cidrs=["127.0.0.0/8"]) as running:
        yield running


@pytest.mark.parametrize("racer", ["rotate", "delete"])
async def test_an_update_slowed_by_its_url_check_undoes_neither_a_rotation_nor_a_delete(
        gateway: Gateway, monkeypatch: pytest.MonkeyPatch, racer: str) -> None:
    key = await gateway.new_key()
    created = await gateway.client.post("/v1/webhooks", headers=key, json={"url": "http://127.0.0.1:9/hook"})
    endpoint = await created.json()
    path = f"/v1/webhooks/{endpoint['id']}"
    checking, go_on = asyncio.Event(), asyncio.Event()
    check = views.refusal

    async def slow_check(*args: object, **kwargs: object) -> str | None:
        checking.set()
        await go_on.wait()  # resolving the new URL's name (up to 5 s)
        return await check(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(views, "refusal", slow_check)
    updating = asyncio.create_task(gateway.client.post(path, headers=key, json={"url": "http://127.0.0.1:10/hook",
                                                                                 "description": "moved"}))
    await asyncio.wait_for(checking.wait(), 10)
    monkeypatch.setattr(views, "refusal", check)
    rotated = None
    if racer == "rotate":
        rotated = await (await gateway.client.post(f"{path}/rotate_secret", headers=key)).json()
    else:
        assert (await gateway.client.delete(path, headers=key)).status == 200
    go_on.set()
    updated = await updating

    stored = await gateway.client.app[WEBHOOK_STORE].get_endpoint(endpoint["id"])
    if rotated is not None:
        assert updated.status == 200
        assert stored is not None and stored.secret == rotated["secret"] != endpoint["secret"]
        assert (stored.url, stored.description) == ("http://127.0.0.1:10/hook", "moved")
    else:
        assert updated.status == 404
        assert stored is None and (await gateway.client.get(path, headers=key)).status == 404
