"""Bearer-key authentication: user and admin keys on user routes; worker and revoked keys never (a revocation
counts once its fact is in the log, read model or not); guessing from an address is refused a while."""

import time
from dataclasses import dataclass, field

from aiohttp import web
from aiohttp.typedefs import Handler

from contracts.ids import hash_api_key
from contracts.readmodel import ApiKeyRecord, UserRecord
from services.gateway.auth_failures import count_failure, count_success, refuse_if_blocked, too_many
from services.gateway.errors import ApiError
from services.gateway.key_usage import KEY_USAGE
from services.runtime.readmodel import ReadModel
from services.runtime.revocations import RevocationCheck

PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/", "/v1/provider/connection"})
KEYED_PATHS = frozenset({"/metrics"})
"""Paths outside `/v1/` that still need a key (the handler says which)."""
CACHE_TTL_S = 30.0
"""The longest a cached key is trusted; `forget` (driven by a watch on the read model) drops one at once."""


@dataclass
class KeyCache:
    read_model: ReadModel
    revocations: RevocationCheck
    known: dict[str, tuple[float, ApiKeyRecord]] = field(default_factory=dict)
    users: dict[str, tuple[float, UserRecord | None]] = field(default_factory=dict)

    async def lookup(self, api_key: str) -> ApiKeyRecord | None:
        digest = hash_api_key(api_key)
        cached = self.known.get(digest)
        if cached is not None and time.monotonic() - cached[0] < CACHE_TTL_S:
            record: ApiKeyRecord | None = cached[1]
        else:
            record = await self.read_model.get_api_key(digest)
            if record is not None:
                self.known[digest] = (time.monotonic(), record)
        # The read model lags the log (a paused ledger, forever): a revoke is final once its fact is stored.
        if record is not None and not record.revoked and await self.revocations.revoked(digest, record.key_id):
            record = record.model_copy(update={"revoked": True})
            self.known[digest] = (time.monotonic(), record)
        return record

    async def user_of(self, record: ApiKeyRecord) -> UserRecord | None:
        """The key's user (cached a short while); None for a key without a user, or one not in the read model."""
        if record.user_id is None:
            return None
        cached = self.users.get(record.user_id)
        if cached is None or time.monotonic() - cached[0] >= CACHE_TTL_S:
            cached = (time.monotonic(), await self.read_model.get_user(record.user_id))
            self.users[record.user_id] = cached
        return cached[1]

    async def allowed_models(self, record: ApiKeyRecord) -> list[str] | None:
        """Catalogue ids the key's user may use; None: every model (also for keys without a user)."""
        user = await self.user_of(record)
        return None if user is None else user.allowed_models

    def forget(self, read_model_key: str) -> None:
        """The read model changed this key or user: look it up afresh next time."""
        kind, _, ident = read_model_key.partition(".")
        (self.known if kind == "apikey" else self.users).pop(ident, None)


KEY_CACHE = web.AppKey("key_cache", KeyCache)
REQUEST_PRINCIPAL = web.RequestKey("principal", ApiKeyRecord)
REQUEST_KEY_DIGEST = web.RequestKey("key_digest", str)
"""The SHA-256 of the key the request presented: a long-lived response checks it is still not revoked."""


def principal(request: web.Request) -> ApiKeyRecord:
    return request[REQUEST_PRINCIPAL]


async def still_authorized(request: web.Request) -> bool:
    """Whether the key this request was admitted with has not been revoked since (from the log itself)."""
    return not await request.app[KEY_CACHE].revocations.revoked(request[REQUEST_KEY_DIGEST],
                                                                principal(request).key_id)


def require_admin(request: web.Request, refusal: str = "Only an admin key may manage users and keys.",
                  ) -> ApiKeyRecord:
    record = principal(request)
    if record.role != "admin":
        raise ApiError(403, refusal, "permission_error",
                       "insufficient_permissions")
    return record


def _refusal(record: ApiKeyRecord | None) -> str | None:
    """Why a presented key may not call the user API; None when it may."""
    if record is None:
        return "Incorrect API key provided."
    if record.revoked:
        return "This API key was revoked; ask an administrator for a new one."
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
    await refuse_if_blocked(request, token)
    # Keys are ASCII; any other byte (aiohttp hands them on as surrogates) names no key.
    record = await request.app[KEY_CACHE].lookup(token) if token.isascii() else None
    refusal = _refusal(record)
    if refusal is not None:
        # Only unknown keys are guesses: a client still sending its revoked key must not trip its address's budget.
        wait = await count_failure(request, token) if record is None else 0.0
        if wait > 0:
            raise too_many(wait)
        raise ApiError(401, refusal, "authentication_error", "invalid_api_key")
    assert record is not None
    await count_success(request, token)
    request[REQUEST_PRINCIPAL] = record
    request[REQUEST_KEY_DIGEST] = hash_api_key(token)
    usage = request.app.get(KEY_USAGE)
    if usage is not None:
        usage.touch(record.key_id)
    return await handler(request)
