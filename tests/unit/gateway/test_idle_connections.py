"""A connection that sends no request, or never finishes its headers, is closed after `IDLE_CONNECTION_S`, not kept
for aiohttp's default hour: silent sockets must not pile up in the gateway."""

import asyncio

import pytest
from aiohttp import web

from infra.embedded import free_port
from services.gateway.http import server


async def _closed_within(port: int, sent: bytes, within_s: float) -> bool:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(sent)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), within_s) == b""
    except TimeoutError:
        return False
    finally:
        writer.close()


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


@pytest.mark.parametrize("sent", [b"", b"GET /healthz HTTP/1.1\r\nHost: x\r\n"])
async def test_a_silent_or_unfinished_connection_is_closed(monkeypatch: pytest.MonkeyPatch, sent: bytes) -> None:
    monkeypatch.setattr(server, "IDLE_CONNECTION_S", 0.5)
    app = web.Application()
    app.router.add_get("/healthz", healthz)
    stop, port = asyncio.Event(), free_port()
    serving = asyncio.create_task(server.serve(app, "127.0.0.1", port, stop))
    try:
        await asyncio.sleep(0.3)
        assert await _closed_within(port, sent, 8.0)
    finally:
        stop.set()
        await serving
