"""The one rule every process opens a NATS connection by: no password or worker key goes to a peer that has not
proved it is the broker.

A broker on this host (127.0.0.1, ::1, localhost), or on a private host the operator declared
(`SHESHNAG_NATS_PRIVATE_HOSTS`), is reached as nats-py does by default: `nats://`, TLS where the server asks. Any
other host (other loopback addresses included: the tests' stand-in for a remote host) may be an impostor, and nats-py
upgrades to TLS only after the server spoke: its URL must be `tls://`, verified (`SHESHNAG_NATS_TLS_CA`, else the
system's CAs), with the handshake first (the server's `tls { handshake_first }`).
"""

import ssl
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from services.runtime.nats.client import server_list

LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
"""Hosts that are this machine's own: a connection to them never leaves it."""
NETWORK_SCHEME = "tls"


class InsecureBrokerUrl(ValueError):
    """A broker reached over the network is named by a URL that would send credentials before TLS."""


def is_local_host(host: str | None) -> bool:
    return host is not None and host.lower() in LOCAL_HOSTS


def _split(url: str) -> tuple[str, str | None]:
    """The URL's scheme and host; nats-py reads a bare `host:port` as `nats://host:port`."""
    parts = urlsplit(url if "://" in url else f"nats://{url}")
    return parts.scheme.lower(), parts.hostname


def is_local(servers: str | list[str], private: frozenset[str] = frozenset()) -> bool:
    """Whether every server in `servers` (comma-separated URLs allowed) is on this host, or one of the `private`
    hosts the operator declared (`SHESHNAG_NATS_PRIVATE_HOSTS`)."""
    return all(is_local_host(host) or (host or "").lower() in private
               for host in (_split(url)[1] for url in server_list(servers)))


def require_tls(servers: str | list[str], setting: str = "SHESHNAG_NATS_URL",
                private: frozenset[str] = frozenset()) -> None:
    """Raises `InsecureBrokerUrl` (naming `setting`, never the URL: it may hold a password) when `servers` are on
    the network and not all `tls://`."""
    if is_local(servers, private):
        return
    plain = sorted({host or "?" for scheme, host in map(_split, server_list(servers)) if scheme != NETWORK_SCHEME})
    if plain:
        raise InsecureBrokerUrl(
            f"{setting} names a broker on the network ({', '.join(plain)}) by a URL that is not tls://: the "
            "password or worker key would be sent before the broker proved who it is. Use tls://host:port (the "
            "broker's client port with a certificate, `tls { handshake_first }`), and SHESHNAG_NATS_TLS_CA when "
            "its CA is not one of the system's")


def tls_options(servers: str | list[str], ca: Path | None, setting: str = "SHESHNAG_NATS_URL",
                private: frozenset[str] = frozenset()) -> dict[str, Any]:
    """nats-py `connect()` options for `servers` under the rule above; `require_tls` first, before anything
    connects. `private`: hosts held to the loopback rule (`SHESHNAG_NATS_PRIVATE_HOSTS`)."""
    require_tls(servers, setting, private)
    if is_local(servers, private):
        return {"tls": ssl.create_default_context(cafile=ca)} if ca else {}
    # Verifies the server's certificate and name: against `ca` alone where given, else the system's CAs.
    return {"tls": ssl.create_default_context(cafile=ca), "tls_handshake_first": True}
