"""A client that stops reading its event stream (its buffers full, so the gateway's writes wait) is cut off after
`client_idle_timeout_s`, and the stream's consumer goes with it: it never holds a handler and a consumer for as long
as its TCP connection lives."""

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from services.runtime.process.settings import ConnectionSettings
from tests.integration.gateway_support import Gateway, running_gateway
from tests.integration.test_gateway_events import new_batch, stream_consumers

IDLE_S = 0.5


@pytest.fixture(scope="module")
async def gateway(connection: ConnectionSettings) -> AsyncIterator[Gateway]:
    async with running_gateway(connection, client_idle_timeout_s=IDLE_S) as running:
        yield running


async def test_a_stream_whose_client_takes_nothing_is_cut_off_and_leaves_no_consumer(
        gateway: Gateway, monkeypatch: pytest.MonkeyPatch) -> None:
    key = await gateway.new_key()
    batch_id = await new_batch(gateway, key, "stalled")
    write = web.StreamResponse.write

    async def never_taken(response: web.StreamResponse, data: bytes) -> None:
        if data.startswith(b": connected"):  # the client's buffers are full: the write waits for ever
            await asyncio.Event().wait()
        await write(response, data)

    monkeypatch.setattr(web.StreamResponse, "write", never_taken)
    reader, writer = await asyncio.open_connection(gateway.client.server.host, gateway.client.server.port)
    writer.write((f"GET /v1/batches/{batch_id}/events HTTP/1.1\r\nHost: x\r\n"
                  f"Authorization: {key['Authorization']}\r\n\r\n").encode())
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 200")
        assert await asyncio.wait_for(reader.read(), 10 * IDLE_S + 5) == b"", "the connection was not closed"
    finally:
        writer.close()
    for _ in range(50):
        if await stream_consumers(gateway.bus, batch_id) == 0:
            break
        await asyncio.sleep(0.1)
    assert await stream_consumers(gateway.bus, batch_id) == 0
