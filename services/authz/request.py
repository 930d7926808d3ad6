"""One auth callout request (nats-server's `server/auth_callout.go`), believed only once shown sealed to our curve key
with the curve key the server signed, signed by the server it names (its id, `N…`), addressed to our issuer and not
expired; anything else goes unanswered (`ForgedRequest`). The answer goes back sealed to the server's curve key."""

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import nkeys

from services.authz import nkey_jwt
from services.authz.keyring import CalloutKeys
from services.authz.xkey import SealError

SERVER_XKEY_HEADER = "Nats-Server-Xkey"
REQUEST_AUDIENCE = "nats-authorization-request"
REQUEST_TYPE = "authorization_request"
CLOCK_LEEWAY_S = 60
"""Seconds past its `exp` (now + the server's auth timeout) a request is still read: the broker's clock may differ."""


class ForgedRequest(ValueError):
    """Not a request nats-server made for us: unsealed, tampered with, signed by another key, or stale."""


@dataclass(frozen=True)
class AuthRequest:
    server_id: str
    """The server's public nkey: it signed the request, and the answer is addressed to it."""
    server_xkey: str
    """The server's curve key: the answer is sealed to it."""
    user_nkey: str
    """The one-off nkey the server made for this connection: the answer's subject."""
    client_id: int
    """The connection's id on that server (what a kick names)."""
    user: str
    password: str = field(repr=False)


def opened(sealed: bytes, headers: Mapping[str, str] | None, keys: CalloutKeys) -> AuthRequest:
    """The request in one message on the callout subject, once it is shown to be the server's."""
    server_xkey = (headers or {}).get(SERVER_XKEY_HEADER, "")
    if not server_xkey:
        raise ForgedRequest("an unsealed request (the server seals every one to our xkey)")
    try:
        token = keys.curve.open(sealed, server_xkey).decode()
        claims = nkey_jwt.verified(token, nkeys.PREFIX_BYTE_SERVER)
    except (SealError, UnicodeDecodeError, nkey_jwt.MalformedJwt) as error:
        raise ForgedRequest(str(error)) from error
    request = claims.get("nats")
    if not isinstance(request, dict):
        raise ForgedRequest("no request claims")
    server = request.get("server_id") or {}
    client = request.get("client_info") or {}
    options = request.get("connect_opts") or {}
    exp = claims.get("exp")
    problems = {
        "signed by a key other than the server it names": claims.get("iss") != server.get("id"),
        "sealed with a key other than the one the server signed": server.get("xkey") != server_xkey,
        "addressed to another issuer": claims.get("sub") != keys.issuer,
        "not an authorization request": (claims.get("aud"), request.get("type")) != (REQUEST_AUDIENCE, REQUEST_TYPE),
        "expired": not isinstance(exp, int) or exp + CLOCK_LEEWAY_S < time.time(),
        "no user nkey or client id": not request.get("user_nkey") or not isinstance(client.get("id"), int),
    }
    for problem, found in problems.items():
        if found:
            raise ForgedRequest(f"request from {str(claims.get('iss'))[:60]!r}: {problem}")
    return AuthRequest(server_id=str(server["id"]), server_xkey=server_xkey, user_nkey=str(request["user_nkey"]),
                       client_id=int(client["id"]), user=str(options.get("user", "")),
                       password=str(options.get("pass", "")))
