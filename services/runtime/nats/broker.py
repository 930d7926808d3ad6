"""A process's one NATS connection: faststream's broker opens it (only through `EventBus.connect`) and runs the
subscribers; what faststream has no form for (fenced, deduplicated publishes, KV buckets, the ordered reader, the auth
callout) are nats-py calls on that same connection via `EventBus`, never a second one."""

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import nats.errors
import nats.js.errors
from faststream.nats import NatsBroker
from faststream.security import BaseSecurity, SASLPlaintext
from nats.aio.client import Client

from services.runtime.nats.client import ReadmittingClient
from services.runtime.process.settings import ConnectionSettings

log = logging.getLogger(__name__)

ErrorCallback = Callable[[Exception], Awaitable[None]]

DRAIN_S = 5
"""How long closing a connection waits for its subscriptions to drain (nats-py's default is 30 s)."""
GRACEFUL_STOP_S = 5.0
"""On stop, a handler still running gets this long to finish (and ack) before it is cancelled and redelivered."""
CLOSE_S = GRACEFUL_STOP_S + DRAIN_S + 5.0
"""The most a stop waits for the connection to close (one whose broker is gone reconnects for ever)."""
TOOL_ATTEMPTS = 3
"""How often an operator tool tries the broker before it gives up and says why."""
BROKER_HICCUPS = (nats.errors.TimeoutError, nats.errors.NoRespondersError, nats.js.errors.NoStreamResponseError,
                  nats.js.errors.ServiceUnavailableError, asyncio.TimeoutError)
"""What a request meets while the broker cannot answer for a moment (a cluster electing a leader): not a fault."""


async def stop_subscriber(subscriber: Any) -> None:
    """faststream's `stop` (a handler in hand gets the grace), also on a connection closed for good: there its
    unsubscribe raises `ConnectionClosedError` before faststream cancels the consume tasks, so the handlers ran on
    past the grace and the caller's own clean-up was skipped. The closed connection dropped the subscription already."""
    try:
        await subscriber.stop()
    except nats.errors.Error:
        tasks = list(getattr(subscriber, "tasks", ()))
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        subscriber.tasks = []
        subscriber.subscription = None


class BrokerUnreachable(ConnectionError):
    """Every attempt to connect failed; the message says the last reason (refused, a certificate not verified…)."""


@dataclass(frozen=True)
class Credentials:
    """Who a connection is, for a broker that authorizes each one (an executor: its id and worker key)."""

    user: str
    password: str = field(repr=False)
    inbox_prefix: str = "_INBOX"
    """Replies and pull deliveries arrive under this prefix: the only subjects the connection may subscribe to."""
    acks_via: str | None = None
    """Where its acks go, for a scheduler to relay (`ReadmittingClient.acks_via`)."""


class ServiceBroker(NatsBroker):
    """faststream's NATS broker, connecting with our client: expired credentials mean reconnect (nats/client.py)."""

    tls_handshake_first = False
    """TLS before the server's first word, for a broker on the network (nats/tls.py); faststream has no option."""
    on_error: ErrorCallback | None = None
    """Told each connection error in place of faststream's logger (which logs each with a traceback)."""
    last_error: Exception | None = None
    """A tool's last connection error: what its `BrokerUnreachable` says."""
    acks_via: str | None = None

    @classmethod
    def to(cls, url: str, name: str, credentials: Credentials | None, attempts: int, stop: asyncio.Event | None,
           on_error: ErrorCallback | None, grace_s: float) -> "ServiceBroker":
        """A broker for `url`, not connected yet, under the TLS rule of `nats/tls.py` (`InsecureBrokerUrl` here).
        `attempts` -1: it connects whenever it can (a service); else `BrokerUnreachable` after that many tries per
        server (a tool exits saying why). A connection closed for good sets `stop`: faststream's consume loops would
        spin on it, and a stopped service exits for its supervisor to start afresh."""
        options: dict[str, Any] = {"reconnect_time_wait": 0.5, "drain_timeout": DRAIN_S}
        if stop is not None:
            async def closed() -> None:
                if not stop.is_set():
                    log.warning("the NATS connection of %s is closed for good; the service stops", name)
                    stop.set()

            options["closed_cb"] = closed
        transport = ConnectionSettings().nats_transport(url)  # refuses a network broker that is not tls://
        tls = transport.get("tls")
        if credentials is not None:
            options |= {"security": SASLPlaintext(username=credentials.user, password=credentials.password,
                                                  ssl_context=tls),
                        "inbox_prefix": credentials.inbox_prefix.encode()}
        elif tls is not None:
            options["security"] = BaseSecurity(ssl_context=tls)
        # faststream's lines go through our logging (one format per service); each message it takes is DEBUG detail.
        broker = cls(url, name=name, max_reconnect_attempts=attempts, graceful_timeout=grace_s, logger=log,
                     log_level=logging.DEBUG, **options)
        broker.tls_handshake_first = transport.get("tls_handshake_first", False)
        broker.acks_via = credentials.acks_via if credentials is not None else None
        broker.on_error = on_error or (broker._tool_error if attempts >= 0 else None)
        return broker

    async def close_within(self, within_s: float = CLOSE_S) -> None:
        """Stop consuming and close the connection, waiting `within_s` at most (then the process goes without)."""
        try:
            await asyncio.wait_for(self.stop(), within_s)
        except (TimeoutError, nats.errors.Error) as error:
            log.warning("the NATS connection did not close (%r); going on without it", error)

    async def _tool_error(self, error: Exception) -> None:
        self.last_error = error
        log.debug("connecting to the broker: %r", error)
        if isinstance(error, ssl.SSLCertVerificationError):  # no retry will make it verify: say so at once
            raise BrokerUnreachable(f"the broker's TLS certificate was not verified ({error}): SHESHNAG_NATS_TLS_CA "
                                    "must name the CA that signed it") from error

    async def _connect(self) -> Client:
        options = self._connection_kwargs | ({"error_cb": self.on_error} if self.on_error else {})
        connection = ReadmittingClient(self.acks_via)
        try:
            await connection.connect(**options, tls_handshake_first=self.tls_handshake_first)
        except nats.errors.NoServersError as error:  # a tool's every attempt failed
            reason = f"{self.last_error!r}" if self.last_error else str(error)
            raise BrokerUnreachable(f"could not connect to the broker ({reason})") from error
        self.config.connect(connection)
        return connection
