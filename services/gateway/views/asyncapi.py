"""`GET /asyncapi.json`: the event catalogue (every fact, its schema, who emits and consumes it), generated from
the workers' declared routers on the first request, then kept."""

import asyncio
import json
from functools import cache

from aiohttp import web

from services.asyncapi import event_catalogue


@cache
def _document() -> bytes:
    return json.dumps(event_catalogue()).encode()


async def asyncapi_json(request: web.Request) -> web.Response:
    return web.Response(body=await asyncio.to_thread(_document), content_type="application/json")
