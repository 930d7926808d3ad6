"""Serving the gateway app: aiohttp's own answers to requests it cannot parse are OpenAI-shaped JSON with a request id.
aiohttp 3.14 builds them in `RequestHandler.handle_error` before any middleware runs; the protocol comes from
`Server.__call__`, made by `AppRunner._make_server`: those are the hooks overridden."""

import asyncio
import ssl
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.web_server import Server

from services.gateway.http.errors import HTTP_ERROR_TYPES, error_response
from services.gateway.http.request_ids import REQUEST_ID_HEADER, request_id
from services.gateway.usecases.refusals import ApiError

MAX_MESSAGE_CHARS = 300
IDLE_CONNECTION_S = 75.0
"""How long a connection may hold no request in progress (none sent yet, headers never finished, or idle between
requests) before it is closed: aiohttp's own default (3,630 s) would let silent sockets pile up for an hour each.
Event streams, uploads and downloads in progress are requests, so this never cuts them."""


class OpenAIErrorRequestHandler(RequestHandler):
    def handle_error(self, request: BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        ident = request_id(request)
        if status >= 500:
            self.log_exception("error handling request from %s (%s)", request.remote, ident, exc_info=exc)
            text = f"The server had an error processing the request ({ident})."
        else:
            self.logger.info("refused an unparsable request from %s (%s): %s", request.remote, ident, message)
            text = f"{HTTPStatus(status).phrase}: {(message or 'the request could not be parsed')[:MAX_MESSAGE_CHARS]}"
        if request.writer.output_size > 0:
            raise ConnectionError("Response is sent already, cannot send another response with the error message")
        error_type, code = HTTP_ERROR_TYPES.get(status, ("invalid_request_error", "bad_request"))
        response = error_response(ApiError(status, text, error_type, code))
        response.headers[REQUEST_ID_HEADER] = ident
        response.force_close()
        return response


class _OpenAIErrorServer(Server):
    def __call__(self) -> RequestHandler:
        return OpenAIErrorRequestHandler(self, loop=self._loop, **self._kwargs)


class GatewayRunner(web.AppRunner):
    """An `AppRunner` whose connections answer unparsable requests in the OpenAI error shape."""

    async def _make_server(self) -> Server:
        made = await super()._make_server()
        return _OpenAIErrorServer(made.request_handler, request_factory=made.request_factory,
                                  handler_cancellation=made.handler_cancellation, loop=made._loop, **made._kwargs)


async def serve(app: web.Application, host: str, port: int, stop: asyncio.Event,
                ssl_context: ssl.SSLContext | None = None, **runner_args: Any) -> None:
    """Serve `app` on host:port (HTTPS with `ssl_context`) until `stop` is set, then clean it up."""
    runner = GatewayRunner(app, **{"keepalive_timeout": IDLE_CONNECTION_S, **runner_args})
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, ssl_context=ssl_context).start()
        await stop.wait()
    finally:
        await runner.cleanup()
