"""JSON bodies: a request's read into its contract model (bounded in size, refused in OpenAI's shape), and a contract
object as the answer, marked when it is an earlier object returned for an identical create."""

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from aiohttp import web
from pydantic import BaseModel

from services.gateway.usecases.refusals import ApiError, parse_body

MAX_BODY_BYTES = 64 * 1024
READ_BYTES = 8192
BODY_IDLE_S = 30.0
"""How long a JSON body may send nothing before the request ends with 408 (an upload's is `client_idle_timeout_s`):
the body is read to its end, so one that stops arriving would otherwise hold its request for as long as the
connection lives."""
BODY_WITHIN_S = 60.0
"""How long a whole JSON body (at most `MAX_BODY_BYTES`) may take: a body that trickles a byte within each `idle_s`
would otherwise hold its request for days."""
DEDUPLICATED_FROM = "X-Sheshnag-Deduplicated-From"
Body = TypeVar("Body", bound=BaseModel)


async def read_body(request: web.Request, model: type[Body], max_bytes: int = MAX_BODY_BYTES,
                    idle_s: float = BODY_IDLE_S) -> Body:
    """The body as `model`: 413 past `max_bytes`, 408 when it sends nothing for `idle_s`, else the 400 the model's
    first refused field names."""
    if (request.content_length or 0) > max_bytes:
        raise _too_large(max_bytes)
    try:
        async with asyncio.timeout(BODY_WITHIN_S):
            raw = await read_capped(_within(request.content.read, idle_s), max_bytes)
    except TimeoutError:
        raise ApiError(408, f"The request body took longer than {BODY_WITHIN_S:.0f}s; send it whole and try again.",
                       code="request_timeout") from None
    if raw is None:
        raise _too_large(max_bytes)
    return parse_body(model, raw)


async def read_capped(read: Callable[[int], Awaitable[bytes]], max_bytes: int) -> bytes | None:
    """Everything `read` gives to its end (each read hands on only what has arrived: a body that comes in several
    segments takes several reads); None once past `max_bytes` (read `READ_BYTES` at a time: a multipart part's reader
    takes no less than its boundary's length)."""
    chunks: list[bytes] = []
    size = 0
    while chunk := await read(READ_BYTES):
        chunks.append(chunk)
        size += len(chunk)
        if size > max_bytes:
            return None
    return b"".join(chunks)


def _within(read: Callable[[int], Awaitable[bytes]], idle_s: float) -> Callable[[int], Awaitable[bytes]]:
    """`read`, each call given `idle_s` for something to arrive, else 408."""
    async def read_within(size: int) -> bytes:
        try:
            async with asyncio.timeout(idle_s):
                return await read(size)
        except TimeoutError:
            raise ApiError(408, f"The request body sent nothing for {idle_s:.0f}s; send the whole body (as its "
                           "Content-Length says) and try again.", code="request_timeout") from None

    return read_within


def _too_large(max_bytes: int) -> ApiError:
    return ApiError(413, f"The request body is larger than {max_bytes} bytes.", code="request_too_large")


def answer(created: BaseModel, same_as: str | None = None) -> web.Response:
    """`created`; `same_as` says it is an earlier object returned for an identical create (a retry or a twin)."""
    return web.json_response(created.model_dump(mode="json"), headers={DEDUPLICATED_FROM: same_as} if same_as else None)
