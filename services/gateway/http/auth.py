"""Bearer-key authentication: user and admin keys on user routes; worker and revoked keys never (a revocation
counts once its fact is in the log, read model or not); guessing from an address is refused a while."""

import asyncio

from aiohttp import web
from aiohttp.typedefs import Handler

from contracts.api.error_codes import BROKER_UNAVAILABLE
from contracts.ids import hash_api_key
from contracts.readmodel import ApiKeyRecord
from services.gateway.background.key_usage import KEY_USAGE
from services.gateway.context import deps
from services.gateway.http.auth_failures import AUTH_FAILURES, SharedFailedAuthentications, too_many
from services.gateway.usecases.refusals import REVOKED_KEY, ApiError
from services.runtime.storage.write_failures import write_fault

PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/", "/v1/provider/connection"})
KEYED_PATHS = frozenset({"/metrics"})
"""Paths outside `/v1/` that still need a key (the route table's `access` says which)."""
REQUEST_PRINCIPAL = web.RequestKey("principal", ApiKeyRecord)
REQUEST_KEY_DIGEST = web.RequestKey("key_digest", str)
"""The SHA-256 of the key the request presented: a long-lived response checks it is still not revoked."""


def principal(request: web.Request) -> ApiKeyRecord:
    return request[REQUEST_PRINCIPAL]


async def still_authorized(request: web.Request) -> bool:
    """Whether the key this request was admitted with has not been revoked since (from the log itself)."""
    return not await deps(request).keys.revocations.revoked(request[REQUEST_KEY_DIGEST], principal(request).key_id)


def admin_only(handler: Handler, refusal: str) -> Handler:
    """`handler` for admin keys; any other is refused with 403 `refusal`."""

    async def checked(request: web.Request) -> web.StreamResponse:
        if principal(request).role != "admin":
            raise ApiError(403, refusal, "permission_error", "insufficient_permissions")
        return await handler(request)

    return checked


def _refusal(record: ApiKeyRecord | None) -> str | None:
    """Why a presented key may not call the user API; None when it may."""
    if record is None:
        return "Incorrect API key provided."
    if record.revoked:
        return REVOKED_KEY
    if record.role == "worker":
        return "Worker keys are for executors and cannot call the user API."
    return None


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path in PUBLIC_PATHS or not (request.path.startswith("/v1/") or request.path in KEYED_PATHS):
        return await handler(request)
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise ApiError(401, "You didn't provide an API key. Send it as 'Authorization: Bearer gk-…'.",
                       "authentication_error", "missing_api_key")
    try:
        record = await _admitted(request, token)
    except (ApiError, web.HTTPException):
        raise
    except Exception as error:
        if write_fault(error) != "broker_unavailable":
            raise
        # Refused, never admitted unchecked; a clear 503 (not a 500) the client retries, as for a write.
        raise ApiError(503, f"The API key could not be checked: the broker did not answer ({type(error).__name__}). "
                       "Try again shortly.", "server_error", BROKER_UNAVAILABLE, retry_after_s=1) from error
    request[REQUEST_PRINCIPAL] = record
    request[REQUEST_KEY_DIGEST] = hash_api_key(token)
    usage = request.app.get(KEY_USAGE)
    if usage is not None:
        usage.touch(record.key_id)
    return await handler(request)


async def _admitted(request: web.Request, token: str) -> ApiKeyRecord:
    """The record of the key the request presents, once it may call the user API; else the refusal (401, 429)."""
    failures, address = request.app.get(AUTH_FAILURES), request.remote or "unknown"
    if failures is None:
        return await _checked(request, token, None, address)
    async with failures.first_try(address, token):
        return await _checked(request, token, failures, address)


async def _checked(request: web.Request, token: str, failures: SharedFailedAuthentications | None,
                   address: str) -> ApiKeyRecord:
    reserved: float | None = None
    if failures is not None:
        # Decided and counted at once (a guess takes its failure before it is looked up): guesses sent together
        # never all pass a budget none of them has been counted in yet.
        wait, reserved = await failures.reserve(address, token)
        if wait > 0:
            raise too_many(wait)  # this address may not try this key now
    guessed = False  # the key named none: only then does the reserved failure stay counted
    try:
        # Keys are ASCII; any other byte (aiohttp hands them on as surrogates) names no key.
        record = await deps(request).keys.lookup(token) if token.isascii() else None
        refusal = _refusal(record)
        if refusal is not None:
            # Only unknown keys are guesses: a client still sending its revoked key must not trip its address's
            # budget.
            if record is None and failures is not None:
                guessed = True
                if (wait := await failures.record_failure(address, token, reserved=reserved)) > 0:
                    raise too_many(wait)
            raise ApiError(401, refusal, "authentication_error", "invalid_api_key")
    finally:  # a right or revoked key, or no answer about it (a 503, a request gone): its reserved failure goes back
        if failures is not None and reserved is not None and not guessed:
            await asyncio.shield(failures.give_back(address, reserved))
    assert record is not None
    if failures is not None:
        await failures.record_success(address, token)
    return record
