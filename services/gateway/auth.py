"""Bearer-key authentication: user and admin keys on user routes; worker keys never."""

import time
from dataclasses import dataclass, field

from aiohttp import web
from aiohttp.typedefs import Handler

from contracts.ids import hash_api_key
from contracts.readmodel import ApiKeyRecord
from services.gateway.errors import ApiError
from services.runtime.readmodel import ReadModel

PUBLIC_PATHS = frozenset({"/healthz", "/"})
CACHE_TTL_S = 30.0



@dataclass
class KeyCache:
    read_model: ReadModel
    known: dict[str, tuple[float, ApiKeyRecord]] = field(default_factory=dict)

    async def lookup(self, api_key: str) -> ApiKeyRecord | None:
        digest = hash_api_key(api_key)
        cached = self.known.get(digest)
        if cached is not None and time.monotonic() - cached[0] < CACHE_TTL_S:
            return cached[1]
        record = await self.read_model.get_api_key(digest)
        if record is not None:
            self.known[digest] = (time.monotonic(), record)
        return record


KEY_CACHE = web.AppKey("key_cache", KeyCache)
REQUEST_PRINCIPAL = "principal"


def principal(request: web.Request) -> ApiKeyRecord:
    record: ApiKeyRecord = request[REQUEST_PRINCIPAL]
    return record


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path in PUBLIC_PATHS or not request.path.startswith("/v1/"):
        return await handler(request)
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "You didn't provide an API key. Send it as 'Authorization: Bearer gk-…'.",
                       "authentication_error", "missing_api_key")
    record = await request.app[KEY_CACHE].lookup(token.strip())
    if record is None:
        raise ApiError(401, "Incorrect API key provided.", "authentication_error", "invalid_api_key")
    if record.role == "worker":
        raise ApiError(401, "Worker keys are for executors and cannot call the user API.",
                       "authentication_error", "invalid_api_key")
    request[REQUEST_PRINCIPAL] = record
    return await handler(request)
