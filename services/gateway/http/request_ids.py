"""Every response's `x-request-id` (the OpenAI SDK's `_request_id`): one id per request, also in error logs."""

import secrets

from aiohttp import web

REQUEST_ID_HEADER = "x-request-id"
REQUEST_ID = web.RequestKey("request_id", str)


def request_id(request: web.BaseRequest) -> str:
    ident = request.get(REQUEST_ID)
    if ident is None:
        ident = request[REQUEST_ID] = f"req_{secrets.token_hex(16)}"
    return ident


async def stamp_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """`on_response_prepare`: runs for every response the app sends, streamed ones (SSE) included."""
    response.headers.setdefault(REQUEST_ID_HEADER, request_id(request))
