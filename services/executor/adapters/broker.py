"""The executor's NATS connection: faststream's broker, as its executor id with its worker key (the auth callout grants
`contracts/permissions.py`'s permissions); the bus is built over the broker's own connection."""

import asyncio
import contextlib
import logging
import ssl
from typing import Any

import nats.js.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig
from nats.js.client import DEFAULT_JS_SUB_PENDING_BYTES_LIMIT, DEFAULT_JS_SUB_PENDING_MSGS_LIMIT

from contracts.permissions import executor_inbox
from contracts.subjects import executor_acks, executor_pulls
from services.executor.adapters.desk import DeskBus, FactDesk
from services.executor.adapters.refusals import Refusals, explain, is_refusal
from services.executor.settings import ExecutorSettings
from services.runtime.nats.broker import Credentials
from services.runtime.nats.bus import EventBus

log = logging.getLogger(__name__)

SOCKET_CLOSED_S = 0.2
"""How long nats-py takes to close a refused connection's socket (well within its 0.5 s wait before retrying)."""
CONNECTION_ERROR_LOG_EVERY_S = 60.0
"""Once joined, the same connection error (a reconnect refused, the broker gone) is logged at most this often."""
SAID_KEPT = 64


def credentials(settings: ExecutorSettings) -> Credentials | None:
    """None without a worker key: such an executor can join only a broker that asks nobody who they are."""
    if not settings.worker_key:
        return None
    return Credentials(settings.executor_id, settings.worker_key, executor_inbox(settings.executor_id),
                       acks_via=executor_acks(settings.executor_id))


class _OwnDurables(JetStreamContext):
    """nats-py's `pull_subscribe` asks for a durable's info first, which an executor may not. On a broker without
    admissions the executor makes its own durables (idempotent: an existing one keeps its position, and the server
    updates in place what may change) and binds; an admitted one only binds: the scheduler made them when it accepted
    its registration (services/executor/durables.py), and its pulls are relayed to its own inbox prefix."""

    makes_durables = True

    async def pull_subscribe(
        self,
        subject: str,
        durable: str | None = None,
        stream: str | None = None,
        config: ConsumerConfig | None = None,
        pending_msgs_limit: int = DEFAULT_JS_SUB_PENDING_MSGS_LIMIT,
        pending_bytes_limit: int = DEFAULT_JS_SUB_PENDING_BYTES_LIMIT,
        inbox_prefix: bytes | None = None,
    ) -> JetStreamContext.PullSubscription:
        if not durable or not stream or config is None:
            return await super().pull_subscribe(subject, durable, stream, config, pending_msgs_limit,
                                                pending_bytes_limit, inbox_prefix)
        if self.makes_durables:
            try:
                await self.add_consumer(stream, config)
            except nats.js.errors.BadRequestError as error:
                # A change the server does not make to an existing durable: it keeps its old config.
                log.warning("durable %s exists with another config (%s); binding to it", durable, error)
        return await self.pull_subscribe_bind(durable=durable, stream=stream, pending_msgs_limit=pending_msgs_limit,
                                              pending_bytes_limit=pending_bytes_limit)


NO_RELAY_WAIT_S = 1.0
"""How long a pull that no scheduler relayed ("no responders": none runs) waits before the next: faststream's consume
loop would otherwise ask again at once, thousands of times a second, until one is back."""


class _RelayedPulls(JetStreamContext.PullSubscription):
    async def fetch(self, batch: int = 1, timeout: float | None = 5,  # noqa: ASYNC109 (nats-py's signature)
                    heartbeat: float | None = None) -> list[Msg]:
        try:
            return await super().fetch(batch, timeout, heartbeat)
        except nats.js.errors.ServiceUnavailableError:
            await asyncio.sleep(NO_RELAY_WAIT_S)
            raise


class _GivenDurables(_OwnDurables):
    makes_durables = False

    async def pull_subscribe_bind(self, *args: Any, **kwargs: Any) -> JetStreamContext.PullSubscription:
        subscription = await super().pull_subscribe_bind(*args, **kwargs)
        subscription.__class__ = _RelayedPulls  # nats-py builds it; only `fetch` differs
        return subscription


class ConnectionErrors:
    """What the connection's errors say: while joining, a refusal or an untrusted certificate ends the try (nats-py
    would retry at once, for ever, unheard); otherwise each distinct error is logged at most once a minute."""

    def __init__(self) -> None:
        self.joined = False
        self.failure: Exception | None = None
        self.failed = asyncio.Event()
        self._said: dict[str, float] = {}

    async def on_error(self, error: Exception) -> None:
        if not self.joined and (is_refusal(error) or isinstance(error, ssl.SSLError)):
            self.failure = error
            self.failed.set()
            return
        said = self._said.get(str(error))
        now = asyncio.get_running_loop().time()
        if said is not None and now - said < CONNECTION_ERROR_LOG_EVERY_S:
            return
        if len(self._said) > SAID_KEPT:
            self._said.clear()  # errors whose text varies: forgetting them costs at most one more line each
        self._said[str(error)] = now
        if self.joined:
            log.warning("NATS connection: %s (retrying; said at most once a minute)", explain(error))
        else:
            log.warning("no connection to NATS yet (%s); still trying", explain(error))

    def next_try(self) -> None:
        self.failure = None
        self.failed.clear()


async def _connect_once(settings: ExecutorSettings, errors: ConnectionErrors,
                        stop: asyncio.Event) -> EventBus | None:
    """The executor's bus; None if refused (`errors.failure` says why) or stopped first. Without a worker key it may
    come up first, so it declares the streams (an admitted one may not: its scheduler did)."""
    errors.next_try()
    admitted = credentials(settings)
    connecting = asyncio.create_task((EventBus if admitted is None else DeskBus).connect(
        settings.connection.nats_url, f"executor-{settings.executor_id}", credentials=admitted,
        declare=admitted is None, stop=stop, on_error=errors.on_error, grace_s=settings.stop_grace_s))
    ended = [asyncio.create_task(errors.failed.wait()), asyncio.create_task(stop.wait())]
    try:
        await asyncio.wait([connecting, *ended], return_when=asyncio.FIRST_COMPLETED)
        if errors.failed.is_set() and not stop.is_set():
            # nats-py closes the refused socket, then sleeps before its next try: it is ended in that sleep.
            await asyncio.wait([connecting, ended[1]], timeout=SOCKET_CLOSED_S)
    finally:
        for task in (*ended, connecting):
            task.cancel()
        await asyncio.gather(*ended, return_exceptions=True)
    if connecting.done() and not connecting.cancelled() and connecting.exception() is None:
        return connecting.result()
    with contextlib.suppress(asyncio.CancelledError):
        await connecting
    return None


async def join(settings: ExecutorSettings, stop: asyncio.Event) -> EventBus | None:
    """The executor's bus, or None if stopped first. A refusal is said and tried again after a back-off (the callout's
    scheduler may be starting), `JoinRefused` past `max_refusals`. A connection closed for good sets `stop`."""
    errors = ConnectionErrors()
    refusals = Refusals(settings.executor_id, settings.join_retry_s, settings.join_retry_max_s,
                        settings.max_refusals)
    while not stop.is_set():
        bus = await _connect_once(settings, errors, stop)
        if bus is not None:
            errors.joined = True
            if isinstance(bus, DeskBus):
                bus.desk = FactDesk(bus.nc, settings.executor_id, settings.object_broker_wait_s)
            config = bus.broker.config.broker_config
            # The broker's subscribers bind their durables through this context (faststream reads it at start); an
            # admitted executor's pulls go to a scheduler, which relays them (services/authz/relay.py).
            if isinstance(bus, DeskBus):
                context: JetStreamContext = _GivenDurables(
                    bus.nc, **{**config.js_options, "prefix": executor_pulls(settings.executor_id)})
            else:
                context = _OwnDurables(bus.nc, **config.js_options)
            config.connection_state.connect(bus.nc, context)
            return bus
        if errors.failure is not None and not stop.is_set():
            await refusals.back_off(explain(errors.failure), stop)
    return None
