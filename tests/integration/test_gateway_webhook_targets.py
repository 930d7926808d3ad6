"""Webhooks never make the gateway a port scanner of the operator's network (issue 29, attack 1): with the default
settings (public addresses only) every loopback, private, link-local, unique-local or metadata target, the stack's
own broker and object store among them, is refused at registration with 400 `invalid_webhook_url`; and a delivery
whose host resolves to such an address later (DNS changed) fails as `refused: address not allowed`, without a
connection reaching the address and without any detail of it shown."""

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from yarl import URL

from contracts.api.webhook import WebhookEndpoint
from contracts.subjects import WEBHOOKS_BUCKET
from services.gateway.webhooks.store import WebhookStore
from services.gateway.webhooks.targets import REFUSED
from services.runtime.nats.kv import open_bucket
from services.runtime.process.settings import ConnectionSettings
from tests.integration.gateway_support import Gateway, running_gateway
from tests.integration.test_gateway_webhooks import deliveries, new_batch, publish, register, until, validated

PUBLIC = "https://1.1.1.1/hooks"
"""A public address, allowed: nothing is sent to it (its owner's batches here state no fact)."""


@pytest.fixture(scope="module")
async def gateway(connection: ConnectionSettings) -> AsyncIterator[Gateway]:
    async with running_gateway(connection, webhook_retry_delays_s=[0.3], webhook_poll_interval_s=0.1,
                               webhook_timeout_s=2.0) as running:
        yield running


def attack_urls(connection: ConnectionSettings) -> list[str]:
    """The targets of the issue's table: the stack's own ports, loopback in its spellings, private, link-local and
    metadata ranges, unique-local IPv6, IPv4 carried in IPv6, and names that mean loopback."""
    nats = URL(connection.nats_url)
    return [f"http://{connection.s3_endpoint}/", f"http://127.0.0.1:{nats.port}/", f"http://localhost:{nats.port}/",
            "http://localhost/hook", "http://localhost./hook", "http://api.localhost/hook", "http://0.0.0.0/hook",
            "http://127.1.2.3/hook", "http://[::1]:8080/hook", "http://10.1.2.3/hook", "http://192.168.1.1/hook",
            "http://172.16.0.1/hook", "http://169.254.169.254/latest/meta-data/", "http://[fd00::1]/hook",
            "http://[fe80::1]/hook", "http://[::ffff:127.0.0.1]/hook", "http://224.0.0.1/hook",
            "http://100.100.100.200/hook", "http://0x7f000001/hook"]


async def test_every_private_or_local_target_is_refused_at_registration(
        gateway: Gateway, connection: ConnectionSettings) -> None:
    alice = await gateway.new_key()
    for url in attack_urls(connection):
        answer = await gateway.client.post("/v1/webhooks", headers=alice, json={"url": url})
        assert answer.status == 400, (url, await answer.text())
        error = (await answer.json())["error"]
        assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "invalid_webhook_url",
                                                                  "url"), url
        assert "refused" in error["message"], url

    # A public address is taken, and so is a name that does not resolve (yet): every attempt resolves it again.
    endpoint = await register(gateway, alice, PUBLIC)
    await register(gateway, alice, "https://hooks.invalid/sheshnag")
    moved = await gateway.client.post(f"/v1/webhooks/{endpoint['id']}", headers=alice,
                                      json={"url": "http://169.254.169.254/"})
    assert moved.status == 400 and (await moved.json())["error"]["code"] == "invalid_webhook_url"
    assert len((await (await gateway.client.get("/v1/webhooks", headers=alice)).json())["data"]) == 2


NOT_URLS_OF_A_HOST = ["https://xn--/", "https://a..b/", f"https://{'a' * 64}.example/", "https://exa\u0000mple.com/x",
                      "https://ho\toks.example/", "https://hooks.example/\u0085", "https://0x08080808/",
                      "https://8.8.2056/"]
"""A host no resolver can look up (a punycode label that decodes to nothing, an empty or 64-character label), a
public address spelt as only the C library reads it (a delivery would look it up as a name), and control characters
anywhere (yarl drops a tab: the URL checked would not be the URL kept)."""


async def test_a_url_that_names_no_host_or_holds_control_characters_is_invalid_url(gateway: Gateway) -> None:
    alice = await gateway.new_key()
    for url in NOT_URLS_OF_A_HOST:
        answer = await gateway.client.post("/v1/webhooks", headers=alice, json={"url": url})
        assert answer.status == 400, (url, await answer.text())
        error = (await answer.json())["error"]
        assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "invalid_url", "url"), url
    endpoint = await register(gateway, alice, PUBLIC)
    moved = await gateway.client.post(f"/v1/webhooks/{endpoint['id']}", headers=alice, json={"url": "https://xn--/"})
    assert moved.status == 400 and (await moved.json())["error"]["code"] == "invalid_url"


async def test_a_delivery_to_a_host_that_now_resolves_to_loopback_fails_as_refused_and_never_connects(
        gateway: Gateway) -> None:
    connections: list[Any] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer.get_extra_info("peername"))
        writer.close()

    listener = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    alice = await gateway.new_key()
    store = WebhookStore(await open_bucket(gateway.bus, WEBHOOKS_BUCKET, scans=True))
    endpoints = []
    for url in (f"http://localhost:{port}/hook", f"http://127.0.0.1:{port}/hook"):
        # Registered while the URL was allowed; since then its name resolves (or it was changed) to loopback.
        registered = await register(gateway, alice, PUBLIC, events=["batch.validated"])
        await store.put_endpoint(WebhookEndpoint.model_validate({**registered, "url": url}))
        endpoints.append(registered["id"])
    batch_id = await new_batch(gateway, alice)
    try:
        await publish(gateway, validated(batch_id))

        async def both_failed() -> bool:
            shown = [await deliveries(gateway, alice, endpoint_id) for endpoint_id in endpoints]
            return all(len(found) == 1 and found[0]["status"] == "failed" for found in shown)

        await until(both_failed, "both deliveries failed")
        for endpoint_id in endpoints:
            [delivery] = await deliveries(gateway, alice, endpoint_id)
            assert [(a["status_code"], a["error"], a["duration_ms"]) for a in delivery["attempts"]] == [
                (None, REFUSED, 0)] * 2
        assert connections == []
    finally:
        listener.close()
        await listener.wait_closed()
