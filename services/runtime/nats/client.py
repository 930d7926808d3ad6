"""The NATS client every service connects with: nats-py's, with three fixes.

An expired admission (`-ERR 'User Authentication Expired'`, an executor's JWT past `SHESHNAG_NATS_EXECUTOR_TTL_S`)
means reconnect, as in the Go client, not close for good (nats-io/nats.py#1019): the auth callout then admits a live
worker key afresh and shuts out a revoked one. A URL may list a cluster's nodes with commas. A failed TLS handshake
left nats-py waiting forever on the dead socket (asyncio's `start_tls` keeps the close from its stream): that wait is
bounded, so the client retries (a service) or gives up saying why (a tool).
"""

import asyncio
import contextlib
import time

import nats.errors
from nats.aio.client import DEFAULT_BUFFER_SIZE, Client, Srv
from nats.aio.transport import TcpTransport

from contracts.subjects import ACK_SUBJECT_HEADER

AUTHENTICATION_EXPIRED = "authentication expired"
"""In the server's error line, lowercased by nats-py's parser."""


def server_list(servers: str | list[str]) -> list[str]:
    """Every server URL in `servers`, where any entry may list several with commas (a cluster's nodes)."""
    entries = [servers] if isinstance(servers, str) else servers
    return [url.strip() for entry in entries for url in entry.split(",") if url.strip()]


CLOSE_WAIT_S = 1.0
"""The longest a closed socket is waited on."""
CLOSED_PAUSE_S = 0.5
"""How long a publish on a connection closed for good waits before it raises (see `ReadmittingClient.publish`)."""


class _Transport(TcpTransport):
    async def wait_closed(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(super().wait_closed(), CLOSE_WAIT_S)


JS_ACK_PREFIX = "$JS.ACK."


class ReadmittingClient(Client):
    def __init__(self, acks_via: str | None = None) -> None:
        super().__init__()
        self.acks_via = acks_via
        """Where this connection's acks go instead of their `$JS.ACK.…` subject (named in `ACK_SUBJECT_HEADER`): an
        admitted executor's, relayed by a scheduler (`services/authz/relay.py`). None: to JetStream itself."""
        self.connected_at: float | None = None
        """`time.monotonic()` when it last connected (and was admitted, where the broker asks who connects)."""

    def _setup_server_pool(self, connect_url: str | list[str]) -> None:
        super()._setup_server_pool(server_list(connect_url))

    async def _connect_to_server(self, s: Srv) -> None:
        """nats-py's, with the bounded close for TCP (nats-py would replace a transport not yet connected)."""
        if s.uri.scheme not in ("nats", "tls"):
            await super()._connect_to_server(s)
            return
        s.last_attempt = time.monotonic()
        if not self._transport:
            self._transport = _Transport()
        await self._transport.connect(s.uri, buffer_size=DEFAULT_BUFFER_SIZE,
                                      connect_timeout=self.options["connect_timeout"])

    async def publish(self, subject: str, payload: bytes = b"", reply: str = "",
                      headers: dict[str, str] | None = None) -> None:
        """nats-py's, except that on a connection closed for good it suspends before raising: faststream's pull
        consume loop suppresses `ConnectionClosedError` and fetches again at once, and nats-py's fetch raises it from
        this publish without ever yielding, so that loop would hold the event loop for ever (the service's stop
        never runs: a closed executor hung instead of exiting)."""
        if self.is_closed:
            await asyncio.sleep(CLOSED_PAUSE_S)
            raise nats.errors.ConnectionClosedError
        if self.acks_via is not None and subject.startswith(JS_ACK_PREFIX):
            subject, headers = self.acks_via, {**(headers or {}), ACK_SUBJECT_HEADER: subject}
        await super().publish(subject, payload, reply, headers)

    async def _process_connect_init(self) -> None:
        await super()._process_connect_init()
        self.connected_at = time.monotonic()

    async def _process_err(self, err_msg: str) -> None:
        if AUTHENTICATION_EXPIRED not in err_msg or not self.options["allow_reconnect"]:
            await super()._process_err(err_msg)
            return
        error = nats.errors.Error(f"nats: {err_msg.strip(chr(39))}")
        await self._error_cb(error)
        await self._process_op_err(error)
