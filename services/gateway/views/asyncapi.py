"""`GET /asyncapi.json`: the event catalogue (every fact, its schema, who emits and consumes it), served from the
checked-in `asyncapi.json` that `python -m services.asyncapi` generates from the workers' declared routers (so the
gateway imports no worker); read on the first request, then kept."""

import asyncio
from functools import cache
from pathlib import Path

import orjson
from aiohttp import web

DOCUMENT = Path(__file__).parents[1] / "asyncapi.json"


@cache
def _document() -> bytes:
    return orjson.dumps(orjson.loads(DOCUMENT.read_bytes()))


async def asyncapi_json(request: web.Request) -> web.Response:
    return web.Response(body=await asyncio.to_thread(_document), content_type="application/json")
