"""A JSON body that stops arriving part-way ends with 408 in OpenAI's shape, never a request that waits for as long as
the connection lives (the body is read to its end, however many segments it comes in)."""

import asyncio
import contextlib
from collections.abc import AsyncIterator

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from pydantic import BaseModel

from services.gateway.http import bodies
from services.gateway.http.errors import error_middleware


class Hook(BaseModel):
    url: str


async def _json(request: web.Request) -> web.Response:
    await bodies.read_body(request, Hook, idle_s=0.5)
    return web.json_response({"ok": True})


@contextlib.asynccontextmanager
async def connected() -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A connection to a server whose one route reads a JSON body."""
    app = web.Application(middlewares=[error_middleware])
    app.router.add_post("/json", _json)
    server = TestServer(app)
    await server.start_server()
    try:
        yield await asyncio.open_connection(server.host, server.port)
    finally:
        await server.close()


async def test_a_json_body_that_stops_arriving_ends_with_408() -> None:
    async with connected() as (reader, writer):
        writer.write(b"POST /json HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
                     b'{"url": ')
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 10)
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length"))
        error = orjson.loads(await reader.readexactly(length))["error"]
        writer.close()
        assert status_line.split()[1] == b"408"
        assert error["code"] == "request_timeout"


async def test_a_json_body_that_trickles_a_byte_within_each_idle_timeout_ends_with_408(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bodies, "BODY_WITHIN_S", 1.5, raising=False)
    async with connected() as (reader, writer):
        writer.write(b"POST /json HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n")
        await writer.drain()

        async def trickle() -> None:
            for _ in range(30):  # a byte every 0.3 s: never idle for 0.5 s, done after 9 s
                writer.write(b" ")
                await writer.drain()
                await asyncio.sleep(0.3)

        trickling = asyncio.create_task(trickle())
        try:
            status_line = await asyncio.wait_for(reader.readline(), 5)
        finally:
            trickling.cancel()
        writer.close()
        assert status_line.split()[1] == b"408"
