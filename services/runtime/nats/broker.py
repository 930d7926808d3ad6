"""A service's one NATS connection: faststream's broker opens it, and our `EventBus` is built over it.

faststream declares and runs the subscribers; the JetStream primitives it has no form for (deduplicated and fenced
publishes with `Nats-Expected-Last-Subject-Sequence`, KV buckets, the gap-detecting ordered reader, the auth
callout) stay nats-py calls, made through the broker's own connection via `EventBus`, never a second one.
"""

import asyncio
import logging
from typing import Any

import nats.errors
from faststream.nats import NatsBroker
from faststream.security import BaseSecurity, SASLPlaintext
from nats.aio.client import Client

from services.runtime.nats.bus import DRAIN_S, Credentials, EventBus
from services.runtime.nats.client import ReadmittingClient
from services.runtime.process.settings import connection_settings

log = logging.getLogger(__name__)

GRACEFUL_STOP_S = 5.0
"""On stop, a handler still running gets this long to finish (and ack) before it is cancelled and redelivered."""
CLOSE_S = GRACEFUL_STOP_S + DRAIN_S + 5.0
"""The most a service's stop waits for its broker connection to close: one the broker keeps refusing, or whose
broker is gone, reconnects for ever, and a process must exit all the same."""


class ServiceBroker(NatsBroker):
    """faststream's NATS broker, connecting with our client: expired credentials mean reconnect (nats/client.py)."""

    tls_handshake_first = False
    """TLS before the server's first word, for a broker on the network (nats/tls.py); faststream has no option."""

    async def close_within(self, within_s: float = CLOSE_S) -> None:
        """Stop consuming and close the connection, waiting `within_s` at most (then the process goes without)."""
        try:
            await asyncio.wait_for(self.stop(), within_s)
        except (TimeoutError, nats.errors.Error) as error:
            log.warning("the NATS connection did not close (%r); going on without it", error)

    async def _connect(self) -> Client:
        connection = ReadmittingClient()
        await connection.connect(**self._connection_kwargs, tls_handshake_first=self.tls_handshake_first)
        self.config.connect(connection)
        return connection


def service_broker(url: str, name: str, credentials: Credentials | None = None,
                   stop: asyncio.Event | None = None) -> ServiceBroker:
    """A broker for one service process; nothing connects until `open_bus`. A connection nats-py closes for good
    (it retries forever, so only on an error it never retries, or at the end) sets `stop`: faststream's consume
    loops would otherwise spin on it, and a stopped service exits for its supervisor to start afresh."""
    # seconds (annotated int); a drain at the end waits for the broker at most DRAIN_S, not nats-py's 30 s
    options: dict[str, Any] = {"reconnect_time_wait": 0.5, "drain_timeout": DRAIN_S}
    if stop is not None:
        async def closed() -> None:
            if not stop.is_set():
                log.warning("the NATS connection of %s is closed for good; the service stops", name)
                stop.set()

        options["closed_cb"] = closed
    transport = connection_settings().nats_transport(url)  # refuses a network broker that is not tls://
    tls = transport.get("tls")
    if credentials is not None:
        options |= {"security": SASLPlaintext(username=credentials.user, password=credentials.password,
                                              ssl_context=tls),
                    "inbox_prefix": credentials.inbox_prefix.encode()}
    elif tls is not None:
        options["security"] = BaseSecurity(ssl_context=tls)
    # faststream's lines go through our logging (one format per service); each message it takes is DEBUG detail.
    broker = ServiceBroker(url, name=name, max_reconnect_attempts=-1, graceful_timeout=GRACEFUL_STOP_S,
                           logger=log, log_level=logging.DEBUG, **options)
    broker.tls_handshake_first = transport.get("tls_handshake_first", False)
    return broker


async def open_bus(broker: NatsBroker, name: str) -> EventBus:
    """Connect the broker and make sure the streams exist; the returned bus publishes on the same connection."""
    connection = await broker.connect()
    bus = EventBus(connection, name)
    await bus.ensure_streams()
    return bus
