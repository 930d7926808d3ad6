"""What one client's event streams may hold: a client that stops reading (its buffers full, so the gateway's writes
wait) is cut off after `client_idle_timeout_s`, the stream's consumer going with it; and an owner holds at most
`event_streams_per_owner` streams open on one gateway (each is a consumer on the broker everyone shares)."""

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from services.runtime.process.settings import ConnectionSettings
from tests.integration.gateway_support import Gateway, running_gateway
from tests.integration.test_gateway_events import new_batch, stream_consumers

IDLE_S = 0.5
STREAMS = 2


@pytest.fixture(scope="module")
async def gateway(connection: ConnectionSettings) -> AsyncIterator[Gateway]:
    async with running_gateway(connection, client_idle_timeout_s=IDLE_S,
                               event_streams_per_owner=STREAMS) as running:
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


async def test_an_owner_holds_at_most_its_streams_open_and_one_closed_makes_room(gateway: Gateway) -> None:
    key, other = await gateway.new_key(), await gateway.new_key()
    batch_id, others = await new_batch(gateway, key, "many"), await new_batch(gateway, other, "theirs")
    server = gateway.client.server

    async def opened(headers: dict[str, str], batch: str) -> tuple[bytes, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection(server.host, server.port)
        writer.write((f"GET /v1/batches/{batch}/events HTTP/1.1\r\nHost: x\r\n"
                      f"Authorization: {headers['Authorization']}\r\n\r\n").encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        if head.startswith(b"HTTP/1.1 200"):
            await asyncio.wait_for(reader.readuntil(b": connected\n\n"), 10)
        return head, writer

    held = [await opened(key, batch_id) for _ in range(STREAMS)]
    refused, writer = await opened(key, batch_id)
    writer.close()
    assert refused.startswith(b"HTTP/1.1 429") and b"Retry-After" in refused
    theirs, writer = await opened(other, others)  # another owner's are not counted against it
    writer.close()
    assert theirs.startswith(b"HTTP/1.1 200")

    held.pop()[1].transport.abort()
    for _ in range(50):
        again, writer = await opened(key, batch_id)
        writer.close()
        if again.startswith(b"HTTP/1.1 200"):
            break
        await asyncio.sleep(0.1)
    assert again.startswith(b"HTTP/1.1 200")
    for _, writer in held:
        writer.close()
