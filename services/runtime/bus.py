"""The JetStream connection: stream declarations, deduplicated publishes, durable consumers."""

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, RetentionPolicy, StorageType, StreamConfig

from contracts.commands import FinalizeBatch, RunBatch
from contracts.events.envelope import Event
from contracts.subjects import (
    EVENTS_STREAM,
    EVENTS_SUBJECTS,
    FINALIZE_COMMAND,
    WORK_STREAM,
    WORK_SUBJECTS,
    run_command,
)

log = logging.getLogger(__name__)

PUBLISH_TIMEOUT_S = 10.0
DEDUP_WINDOW_S = 3600.0
"""A retried publish within this window is recognised as the same fact."""


class PoisonMessage(Exception):
    """A message that can never be handled; it is recorded and terminated, never retried."""


@dataclass(frozen=True)
class ConsumerPolicy:
    ack_wait_s: float = 30.0
    max_deliver: int = 20
    max_ack_pending: int = 64
    retry_delays_s: tuple[float, ...] = (0.5, 1.0, 2.0, 5.0, 10.0)


Handler = Callable[[Msg], Awaitable[None]]
PoisonHandler = Callable[[Msg, BaseException], Awaitable[None]]


class EventBus:
    """One NATS connection per service process."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream(timeout=PUBLISH_TIMEOUT_S)

    @classmethod
    async def connect(cls, url: str, name: str) -> "EventBus":
        nc = await nats.connect(url, name=name, max_reconnect_attempts=-1, reconnect_time_wait=0.5)
        bus = cls(nc)
        await bus.ensure_streams()
        return bus

    async def close(self) -> None:
        await self.nc.drain()

    async def ensure_streams(self) -> None:
        await self._ensure_stream(
            StreamConfig(
                name=EVENTS_STREAM,
                subjects=[EVENTS_SUBJECTS],
                storage=StorageType.FILE,
                retention=RetentionPolicy.LIMITS,
                duplicate_window=DEDUP_WINDOW_S,
            )
        )
        await self._ensure_stream(
            StreamConfig(
                name=WORK_STREAM,
                subjects=[WORK_SUBJECTS],
                storage=StorageType.FILE,
                retention=RetentionPolicy.WORK_QUEUE,
                duplicate_window=DEDUP_WINDOW_S,
            )
        )

    async def _ensure_stream(self, config: StreamConfig) -> None:
        try:
            await self.js.add_stream(config)
        except nats.js.errors.BadRequestError:
            # Another process declared it first, possibly with an older config: keep theirs.
            await self.js.stream_info(config.name or "")

    async def publish(self, event: Event) -> int:
        """Publish a fact once: a retried publish of the same event_id is dropped by the server."""
        ack = await self.js.publish(
            event.subject,
            event.model_dump_json().encode(),
            headers={"Nats-Msg-Id": event.event_id},
            stream=EVENTS_STREAM,
        )
        return ack.seq

    async def send_run(self, command: RunBatch) -> None:
        await self.js.publish(
            run_command(command.executor_id),
            command.model_dump_json().encode(),
            headers={"Nats-Msg-Id": command.msg_id},
            stream=WORK_STREAM,
        )

    async def send_finalize(self, command: FinalizeBatch) -> None:
        await self.js.publish(FINALIZE_COMMAND, command.model_dump_json().encode(),
                              headers={"Nats-Msg-Id": command.msg_id}, stream=WORK_STREAM)

    async def durable_subscription(
        self, stream: str, durable: str, subjects: Sequence[str], policy: ConsumerPolicy
    ) -> JetStreamContext.PullSubscription:
        config = ConsumerConfig(
            durable_name=durable,
            filter_subjects=list(subjects),
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=policy.ack_wait_s,
            max_deliver=policy.max_deliver,
            max_ack_pending=policy.max_ack_pending,
        )
        try:
            await self.js.add_consumer(stream, config)
        except nats.js.errors.BadRequestError as error:
            # An existing durable keeps its position; its config is not changed under it.
            log.warning("durable %s exists with another config (%s); binding to it", durable, error)
        return await self.js.pull_subscribe_bind(durable=durable, stream=stream)

    async def consume(
        self,
        stream: str,
        durable: str,
        subjects: Sequence[str],
        handler: Handler,
        policy: ConsumerPolicy,
        on_poison: PoisonHandler | None = None,
        stop: asyncio.Event | None = None,
    ) -> None:
        """Run `handler` on each message until `stop` is set; ack after it returns.

        A failing handler is retried later with backoff (never a hot loop); on its last delivery, or
        when it raises PoisonMessage, `on_poison` records it and the message is terminated.
        """
        subscription = await self.durable_subscription(stream, durable, subjects, policy)
        stop = stop or asyncio.Event()
        try:
            while not stop.is_set():
                try:
                    messages = await subscription.fetch(1, timeout=1.0)
                except nats.errors.TimeoutError:
                    continue
                except nats.errors.ConnectionClosedError:
                    return
                for message in messages:
                    await self._handle_one(message, handler, policy, on_poison)
        finally:
            # A live pull subscription would hold the connection's drain open until it times out.
            if not self.nc.is_closed:
                await subscription.unsubscribe()

    async def _handle_one(
        self, message: Msg, handler: Handler, policy: ConsumerPolicy, on_poison: PoisonHandler | None
    ) -> None:
        keepalive = asyncio.create_task(_keep_in_progress(message, policy.ack_wait_s / 3))
        try:
            await handler(message)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            deliveries = message.metadata.num_delivered
            final = isinstance(error, PoisonMessage) or 0 < policy.max_deliver <= deliveries
            if final:
                log.exception("giving up on %s after %d deliveries", message.subject, deliveries)
                if on_poison is not None:
                    await on_poison(message, error)
                await message.term()
            else:
                delay = policy.retry_delays_s[min(deliveries - 1, len(policy.retry_delays_s) - 1)]
                log.warning("handler failed on %s (delivery %d), retry in %.1fs: %r",
                            message.subject, deliveries, delay, error)
                await message.nak(delay=delay)
        else:
            await message.ack_sync()
        finally:
            keepalive.cancel()


async def _keep_in_progress(message: Msg, every_s: float) -> None:
    """Long work keeps its lease on the message instead of being redelivered to someone else."""
    while True:
        await asyncio.sleep(every_s)
        try:
            await message.in_progress()
        except (nats.errors.Error, OSError):
            return
