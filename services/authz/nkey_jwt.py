"""NATS JWTs (`alg: ed25519-nkey`) in nats-io/jwt v2's format (ADR-26 for auth callout): base64url JSON header and
claims, an ed25519 signature of `header.claims` by the issuer's nkey, `jti` the base32 SHA-512/256 of the generic
claims. Encoded with an issuer nkey, verified and decoded."""

import base64
import hashlib
import json
import os
import time
from typing import Any

import nkeys
from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey

from services.authz.xkey import decode_public

HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}
GENERIC_CLAIMS = ("aud", "exp", "jti", "iat", "iss", "name", "nbf", "sub")
"""The claims nats-io/jwt hashes into `jti`, in its field order."""

Claims = dict[str, Any]


class MalformedJwt(ValueError):
    """Not a NATS JWT: wrong shape, bad base64 or bad JSON."""


class InvalidSignature(MalformedJwt):
    """A NATS JWT its issuer did not sign (tampered with, or forged under someone else's key)."""


def new_account_seed() -> str:
    """A fresh account nkey seed (`SA…`): the issuer the server trusts for auth callout answers."""
    return bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_ACCOUNT)).decode()


def public_key(seed: str) -> str:
    """The public nkey (`A…` for an account seed) of `seed`."""
    return bytes(nkeys.from_seed(seed.encode()).public_key).decode()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _jti(claims: Claims) -> str:
    generic = {name: claims[name] for name in GENERIC_CLAIMS if name in claims and name != "jti"}
    digest = hashlib.new("sha512_256", _json(generic)).digest()
    return base64.b32encode(digest).rstrip(b"=").decode()


def encode(claims: Claims, issuer_seed: str) -> str:
    """Sign `claims` (with `iss`, `iat` and `jti` filled in) as a JWT of the issuer's."""
    signer = nkeys.from_seed(issuer_seed.encode())
    full = {**claims, "iss": bytes(signer.public_key).decode(), "iat": int(time.time())}
    full = {"jti": _jti(full), **full}
    signed = f"{_b64(_json(HEADER))}.{_b64(_json(full))}"
    return f"{signed}.{_b64(signer.sign(signed.encode()))}"


def decode(token: str) -> Claims:
    """The claims of a JWT, its signature unchecked (see `verified` for one that checks it)."""
    return _parts(token)[1]


def verified(token: str, issuer_prefix: int) -> Claims:
    """The claims of a JWT whose `iss` is an nkey of this kind (`nkeys.PREFIX_BYTE_SERVER`: a server's) and
    whose signature that key made; InvalidSignature otherwise. Who the issuer should be is the caller's check."""
    header_and_claims, claims, signature = _parts(token)
    issuer = claims.get("iss")
    try:
        key = VerifyKey(decode_public(issuer if isinstance(issuer, str) else "", issuer_prefix))
        key.verify(header_and_claims, signature)
    except (ValueError, BadSignatureError) as error:
        raise InvalidSignature(f"not signed by its issuer {str(issuer)[:60]!r}: {error}") from error
    return claims


def _parts(token: str) -> tuple[bytes, Claims, bytes]:
    """The signed part, the claims and the signature of a JWT."""
    parts = token.strip().split(".")
    if len(parts) != 3:
        raise MalformedJwt("a JWT has three parts")
    try:
        header = json.loads(_unb64(parts[0]))
        claims = json.loads(_unb64(parts[1]))
        signature = _unb64(parts[2])
    except (ValueError, UnicodeDecodeError) as error:
        raise MalformedJwt(str(error)) from error
    if not isinstance(header, dict) or header.get("alg") != HEADER["alg"] or not isinstance(claims, dict):
        raise MalformedJwt("not an ed25519-nkey JWT")
    return f"{parts[0]}.{parts[1]}".encode(), claims, signature
