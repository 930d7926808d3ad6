"""`up` waits for the gateway to admit its admin key without spending the address's budget of failed keys: it asks
ever more slowly, and a 429 ends the wait (the stack is announced all the same)."""

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from infra.up import wait_for_admission


async def gateway_answering(status: int, asked: list[str]) -> tuple[TestServer, int]:
    async def me(request: web.Request) -> web.Response:
        asked.append(request.headers.get("Authorization", ""))
        return web.json_response({}, status=status)

    app = web.Application()
    app.router.add_get("/v1/me", me)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    assert server.port is not None
    return server, server.port


async def test_an_unknown_key_is_asked_about_ever_more_slowly() -> None:
    asked: list[str] = []
    server, port = await gateway_answering(401, asked)
    try:
        await wait_for_admission(port, "gk-new", within_s=3.0)
    finally:
        await server.close()
    assert set(asked) == {"Bearer gk-new"}
    assert 1 <= len(asked) <= 6  # 0.2, 0.4, 0.8, 1.6 s apart at most (a slow machine asks less): never 15 asks


@pytest.mark.parametrize("status", [200, 429], ids=["admitted", "too many failed keys"])
async def test_an_admitted_key_or_a_429_ends_the_wait_at_once(status: int) -> None:
    asked: list[str] = []
    server, port = await gateway_answering(status, asked)
    try:
        await wait_for_admission(port, "gk-new", within_s=30.0)
    finally:
        await server.close()
    assert len(asked) == 1
