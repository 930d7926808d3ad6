"""The auth callout's keys, all derived from its one secret, the issuer seed: the account nkey that signs answers, the
curve key the server seals requests to, and the system user that kicks revoked executors. Derived (domain-separated
SHA-256), so the broker config and the scheduler, which hold the seed already, need no second secret."""

import hashlib
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import nkeys

from services.authz.nkey_jwt import public_key
from services.authz.xkey import CurveKey

SYSTEM_ACCOUNT = "SYS"
SYSTEM_USER = "system"
"""The broker's system account user: the callout's responder kicks revoked executors' connections with it."""


@dataclass(frozen=True)
class CalloutKeys:
    issuer_seed: str = field(repr=False)

    @property
    def issuer(self) -> str:
        """The account public key (`A…`) the server trusts to sign answers."""
        return public_key(self.issuer_seed)

    @property
    def curve(self) -> CurveKey:
        return CurveKey.derived(self._seed_bytes(), b"sheshnag auth callout xkey")

    @property
    def system_password(self) -> str:
        return hashlib.sha256(b"sheshnag system account user\0" + self._seed_bytes()).hexdigest()

    def system_url(self, core_url: str) -> str:
        """The broker URL(s) of `core_url` with the system user's credentials in place of the core user's."""
        def swap(url: str) -> str:
            parts = urlsplit(url.strip())
            host = parts.netloc.rpartition("@")[2]
            return urlunsplit(parts._replace(netloc=f"{SYSTEM_USER}:{self.system_password}@{host}"))
        return ",".join(swap(url) for url in core_url.split(","))

    def _seed_bytes(self) -> bytes:
        _, raw = nkeys.decode_seed(self.issuer_seed.encode())
        return bytes(raw)
