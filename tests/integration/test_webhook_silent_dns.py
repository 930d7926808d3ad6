"""A tenant cannot tie up the gateway's threads with webhook hosts whose name server never answers (a name under a
zone the attacker serves, left silent): the registrations answer once their resolution times out, each name was
asked of the name server without the C library's blocking `getaddrinfo` (which holds a thread of the pool every other
blocking call of the gateway shares until the library gives up)."""

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from services.runtime.process.settings import ConnectionSettings
from tests.integration.gateway_support import Gateway, running_gateway

SILENT_ZONE = ".silent-zone.example"
REGISTRATIONS = 12


@pytest.fixture(scope="module")
def silent_name_server() -> Iterator[socket.socket]:
    """A UDP name server on loopback that takes every query and answers none."""
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    server.setblocking(False)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
async def gateway(connection: ConnectionSettings, silent_name_server: socket.socket) -> AsyncIterator[Gateway]:
    host, port = silent_name_server.getsockname()
    async with running_gateway(connection, webhook_nameservers=[f"{host}:{port}"]) as running:
        yield running


def queried_names(server: socket.socket) -> set[str]:
    """The names asked of `server` so far (each query's first question, labels joined)."""
    names: set[str] = set()
    while True:
        try:
            query = server.recv(4096)
        except BlockingIOError:
            return names
        labels, at = [], 12
        while at < len(query) and query[at]:
            labels.append(query[at + 1:at + 1 + query[at]].decode(errors="replace"))
            at += 1 + query[at]
        names.add(".".join(labels))


async def test_registrations_on_silent_name_servers_hold_no_thread(
        gateway: Gateway, silent_name_server: socket.socket, monkeypatch: pytest.MonkeyPatch) -> None:
    blocking_lookups: list[str] = []
    system_lookup = socket.getaddrinfo

    def watched(host: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host.endswith(SILENT_ZONE):
            blocking_lookups.append(host)
        return system_lookup(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", watched)
    tenant = await gateway.new_key()
    hosts = [f"h{number}{SILENT_ZONE}" for number in range(REGISTRATIONS)]
    answers = await asyncio.gather(*(gateway.client.post("/v1/webhooks", headers=tenant, json={
        "url": f"https://{host}/hook"}) for host in hosts))

    # A name that does not resolve in time may be registered: each delivery resolves it again.
    assert [answer.status for answer in answers] == [200] * REGISTRATIONS
    assert blocking_lookups == []
    assert set(hosts) <= queried_names(silent_name_server)
