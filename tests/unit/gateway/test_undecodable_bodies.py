"""A body aiohttp cannot decode as its headers say (gzip that is not gzip) is the client's error: a 400 in OpenAI's
shape, never a 500."""

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from services.gateway.http import bodies
from services.gateway.http.errors import error_middleware
from services.gateway.usecases.retry import RetryRequest


async def _json(request: web.Request) -> web.Response:
    await bodies.read_body(request, RetryRequest)
    return web.json_response({"ok": True})


async def test_a_body_whose_content_encoding_is_broken_is_a_400() -> None:
    app = web.Application(middlewares=[error_middleware])
    app.router.add_post("/json", _json)
    client = TestClient(TestServer(app))
    await client.start_server()
    try:
        answer = await client.post("/json", data=b'{"a": 1}', headers={"Content-Encoding": "gzip",
                                                                        "Content-Type": "application/json"})
        assert answer.status == 400
        error = (await answer.json())["error"]
        assert (error["type"], error["code"]) == ("invalid_request_error", "bad_request")
        assert "gzip" in error["message"]
    finally:
        await client.close()
