"""The executor's NATS connection: faststream's broker, as its executor id with its worker key, which the broker's
auth callout turns into the permissions of `contracts/permissions.py` (its facts then go through the scheduler's
fact desk). The bus is built over the broker's own connection: one connection per process."""

import asyncio
import contextlib
import logging

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig
from nats.js.client import DEFAULT_JS_SUB_PENDING_BYTES_LIMIT, DEFAULT_JS_SUB_PENDING_MSGS_LIMIT

from contracts.permissions import executor_inbox
from services.executor.adapters.desk import DeskBus, FactDesk
from services.executor.settings import ExecutorSettings
from services.runtime.broker import ServiceBroker, service_broker
from services.runtime.bus import Credentials, EventBus

log = logging.getLogger(__name__)

RETRY_EVERY_S = 1.0
REFUSAL_LOG_EVERY = 30
"""Refusals between two warnings: a refused executor keeps trying, quietly."""


def credentials(settings: ExecutorSettings) -> Credentials | None:
    """None without a worker key: such an executor can join only a broker that asks nobody who they are."""
    if not settings.worker_key:
        return None
    return Credentials(settings.executor_id, settings.worker_key, executor_inbox(settings.executor_id))


def connection_name(settings: ExecutorSettings) -> str:
    return f"executor-{settings.executor_id}"


def executor_broker(settings: ExecutorSettings, stop: asyncio.Event | None = None) -> ServiceBroker:
    """The executor's broker; nothing connects until `join`. A connection closed for good sets `stop`."""
    broker = service_broker(settings.connection.nats_url, connection_name(settings), credentials(settings), stop)
    # On stop, the batch in hand gets the executor's own grace to commit (faststream waits this long for running
    # handlers, then cancels them: their commands are redelivered and resumed).
    broker.config.broker_config.graceful_timeout = settings.stop_grace_s
    return broker


class _OwnDurables(JetStreamContext):
    """nats-py's `pull_subscribe` asks for a durable's info before creating it, which an executor may not do: its
    credentials allow only the create of its own two durables, on their own filters (the filter travels in the
    API subject), then pulls and acks. So it creates (idempotent) and binds, as `EventBus.durable_subscription`;
    its pulls are answered under the connection's own inbox prefix, the only one it may subscribe to (faststream
    asks for nats-py's default `_INBOX.`)."""

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
        try:
            # An existing durable keeps its position; the server updates what may change in place (an upgraded
            # executor's `max_ack_pending`, its ack wait, its deliveries), so the durable runs under this config.
            await self._jsm.add_consumer(stream, config)
        except nats.js.errors.BadRequestError as error:
            # A change the server does not make to an existing durable: it keeps its old config.
            log.warning("durable %s exists with another config (%s); binding to it", durable, error)
        return await self.pull_subscribe_bind(durable=durable, stream=stream, pending_msgs_limit=pending_msgs_limit,
                                              pending_bytes_limit=pending_bytes_limit)


def _refused(error: Exception) -> bool:
    return "authorization violation" in str(error).lower()


async def join(broker: ServiceBroker, settings: ExecutorSettings, stop: asyncio.Event) -> EventBus | None:
    """Connect `broker`; the bus over its connection, or None if stopped first. A refusal is retried: a scheduler
    that answers for the broker may still be starting, or the ledger not yet have folded a new worker key."""
    refusals = 0
    while not stop.is_set():
        try:
            connection = await broker.connect()
        except nats.errors.Error as error:
            if not _refused(error):
                raise
        else:
            return await _bus_over(broker, connection, settings)
        if refusals % REFUSAL_LOG_EVERY == 0:
            log.warning("NATS refused executor %s (its worker key is unknown, revoked or not a worker key, or no "
                        "scheduler answers for the broker yet); retrying", settings.executor_id)
        refusals += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), RETRY_EVERY_S)
    return None


async def _bus_over(broker: ServiceBroker, connection: Client, settings: ExecutorSettings) -> EventBus:
    config = broker.config.broker_config
    # The broker's subscribers create their durables through this context (faststream reads it at start).
    config.connection_state.connect(connection, _OwnDurables(connection, **config.js_options))
    if credentials(settings) is None:
        bus = EventBus(connection, connection_name(settings))
        await bus.ensure_streams()  # a broker that asks nobody who they are: this executor may come up first
        return bus
    # Admitted by worker key, it may not touch the event log: its facts and reads go through the desk. Nor may it
    # look at a stream (its info names other tenants and executors): the scheduler admitting it made them.
    desk_bus = DeskBus(connection, connection_name(settings))
    desk_bus.desk = FactDesk(connection, settings.executor_id, settings.object_broker_wait_s)
    return desk_bus


async def connect(settings: ExecutorSettings, stop: asyncio.Event) -> EventBus | None:
    """The executor's connection with no subscribers of a broker's (tools, tests); `EventBus.close` ends it."""
    return await join(executor_broker(settings), settings, stop)


async def stop_consuming(broker: ServiceBroker) -> None:
    """Take no more commands; the handlers still running get the broker's graceful timeout, together, to finish
    (then they are cancelled, unacked: redelivered). The connection stays open, for what is left to say."""
    await asyncio.gather(*(subscriber.stop() for subscriber in broker.subscribers))
