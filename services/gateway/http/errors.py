"""OpenAI-shaped errors: the middleware that renders every failure (the refusal views and use cases raise is
`usecases.refusals.ApiError`)."""

import logging

from aiohttp import web
from aiohttp.typedefs import Handler
from aiohttp.web_protocol import RequestPayloadError

from contracts.api.batch import SUPPORTED_ENDPOINTS
from contracts.api.error import ErrorResponse, ErrorType
from services.gateway.http.request_ids import request_id
from services.gateway.usecases.refusals import ApiError

log = logging.getLogger(__name__)


def error_response(error: ApiError) -> web.Response:
    # 4xx answers are final: tell the SDK not to retry them, unless a rate limit says when to come back.
    headers = {"x-should-retry": "false"} if error.status < 500 else {}
    if error.retry_after_s is not None:
        headers = {"Retry-After": str(error.retry_after_s)}
    return web.json_response(ErrorResponse(error=error.body).model_dump(), status=error.status, headers=headers)


HTTP_ERROR_TYPES: dict[int, tuple[ErrorType, str]] = {
    404: ("not_found_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    413: ("invalid_request_error", "request_too_large"),
    500: ("server_error", "internal_error"),
    504: ("server_error", "timeout"),
}
API_PREFIX = "/v1/"
BATCH_API_PATHS = ("/v1/files", "/v1/batches", "/v1/models")
"""OpenAI's Batch API as this deployment serves it: named first when a request finds no route."""
CLIENT_CLOSED_REQUEST = 499
"""What the metrics and access log record for a request whose client went away (nginx's code); never sent."""


def client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as error:
        return error_response(error)
    except web.HTTPException as http_error:
        if http_error.status < 400:
            raise
        return http_error_response(request, http_error)
    except RequestPayloadError as unreadable:
        # aiohttp could not decode the body as sent (a Content-Encoding that is not what it says, a broken chunked
        # body): the client's error, never a 500.
        cause = unreadable.__cause__
        said = getattr(cause, "message", None) or "its encoding is broken"
        return error_response(ApiError(400, f"The request body could not be read: {said}."[:300],
                                       "invalid_request_error", "bad_request"))
    except ConnectionResetError:
        if not client_gone(request):
            return internal_error(request)
        # The client hung up mid-request (an upload cut short): nothing to answer, nothing went wrong here.
        log.info("client went away during %s %s (%s)", request.method, request.path, request_id(request))
        return web.Response(status=CLIENT_CLOSED_REQUEST)
    except Exception:
        return internal_error(request)


def http_error_response(request: web.Request, http_error: web.HTTPException) -> web.Response:
    """An error aiohttp raised (mostly its router's) in OpenAI's shape, a 405 with its `Allow` header."""
    error_type, code = HTTP_ERROR_TYPES.get(http_error.status, ("invalid_request_error", "bad_request"))
    message = f"{http_error.reason}: {request.method} {request.path}"
    if isinstance(http_error, web.HTTPMethodNotAllowed):
        message = (f"{request.method} is not allowed on {request.path}; it answers "
                   f"{', '.join(sorted(http_error.allowed_methods))}.")
    elif isinstance(http_error, web.HTTPNotFound) and request.path.startswith(API_PREFIX):
        message = unknown_route_message(request)
    response = error_response(ApiError(http_error.status, message, error_type, code))
    if "Allow" in http_error.headers:
        response.headers["Allow"] = http_error.headers["Allow"]
    return response


def unknown_route_message(request: web.Request) -> str:
    """What a request to a /v1 path no route has is told: what this deployment serves instead."""
    served = {path for resource in request.app.router.resources()  # by their first two segments: /v1/files, …
              if (path := "/".join(resource.canonical.split("/")[:3])).startswith(API_PREFIX)}
    batch_api = [path for path in BATCH_API_PATHS if path in served]
    others = sorted(served - set(batch_api))
    serves = (f"This deployment serves the Batch API: {', '.join(batch_api)}"
              + (f", and beside it {', '.join(others)}" if others else "") + "; /openapi.json lists every route.")
    if request.path in SUPPORTED_ENDPOINTS:
        return (f"{request.method} {request.path} is not served directly: it runs as the url of the lines of a batch. "
                f"Upload a JSONL file of requests with \"url\": \"{request.path}\" to /v1/files (purpose \"batch\"), "
                f"then create a batch with endpoint \"{request.path}\" on /v1/batches. {serves}")
    return f"There is no route {request.method} {request.path}. {serves}"


def internal_error(request: web.Request) -> web.Response:
    """Logs the exception being handled, with the request id the client gets."""
    ident = request_id(request)
    log.exception("unhandled error on %s %s (%s)", request.method, request.path, ident)
    return error_response(ApiError(500, f"The server had an error processing the request ({ident}).",
                                   "server_error", "internal_error"))
