"""Durable subscriptions declared on faststream, and the one delivery policy every one of them runs under.

A handler takes its contract model (decoded by faststream, never a raw message) and returns; the policy around
it acks only then, keeps a long handler's lease (in-progress), retries a failure later with backoff (never a hot
loop), and on the last delivery, or at once when it cannot ever succeed (`PoisonMessage`, a payload that is not
its contract), hands the fact to the subscription's poison handler, then terminates the message.
"""

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from faststream import BaseMiddleware, ContextRepo
from faststream.middlewares import AckPolicy
from faststream.nats import JStream, NatsRouter, PullSub
from nats.aio.msg import Msg
from nats.js.api import AckPolicy as JetStreamAck
from nats.js.api import ConsumerConfig, DeliverPolicy
from opentelemetry.trace import Span, SpanKind, Tracer
from pydantic import BaseModel

from contracts.events.envelope import Event
from contracts.subjects import event_subject
from services.runtime import metrics
from services.runtime.bus import ConsumerPolicy, PoisonMessage, _batch_of, _keep_in_progress
from services.runtime.logfmt import BATCH_ID
from services.runtime.telemetry import extract_context, tracer

log = logging.getLogger(__name__)

PoisonHandler = Callable[[Any, BaseException, Any], Awaitable[None]]
"""(the fact, decoded, or None when it is not its contract; the error; the service's dependencies)."""

ONE_AT_A_TIME = PullSub(batch_size=1, timeout=1.0)
"""Fetch one message, handle it, then the next: a worker's concurrency is inside its handler, not here."""


def fact_filter(contract: type[Event]) -> str:
    """Every fact of this type, whatever its aggregate: `BatchCreated` → `evt.batch.*.created`."""
    return event_subject(contract.kind, "*", contract.name)


@dataclass(frozen=True)
class Durable:
    """A durable pull consumer of one contract: its stream, name, single filter and delivery policy."""

    contract: type[BaseModel]
    stream: str
    name: str
    subject: str
    policy: ConsumerPolicy = field(default_factory=ConsumerPolicy)

    def consumer_config(self) -> ConsumerConfig:
        # Named, with a single filter: the filter then travels in the API subject, where authorization can pin it.
        return ConsumerConfig(name=self.name, durable_name=self.name, filter_subject=self.subject,
                              ack_policy=JetStreamAck.EXPLICIT, deliver_policy=DeliverPolicy.ALL,
                              ack_wait=self.policy.ack_wait_s, max_deliver=self.policy.max_deliver,
                              max_ack_pending=self.policy.max_ack_pending)


@dataclass(frozen=True)
class LogFollower:
    """A reader of the EVENTS log in stream order from a sequence of its own (a fold: the ledger, the scheduler's
    book). It runs on `eventlog.follow`, the gap-detecting ordered pull reader, which faststream has no form for;
    it is declared here so that the service's table, and the AsyncAPI document, show what it consumes."""

    name: str
    contracts: tuple[type[Event], ...]
    description: str


@dataclass(frozen=True)
class _Declared:
    durable: Durable
    on_poison: PoisonHandler | None


class ServiceRouter(NatsRouter):
    """One service's table of durable subscriptions. `dependencies` names the service's object in faststream's
    context: handlers take it as a `Context()` parameter of that name, poison handlers as their third argument."""

    def __init__(self, service: str, dependencies: str) -> None:
        self.service = service
        self.dependencies = dependencies
        self.tracer = tracer(service)
        self.declared: dict[str, _Declared] = {}
        self.followers: list[LogFollower] = []
        super().__init__(middlewares=[self._delivery])

    def durable(self, durable: Durable, handler: Callable[..., Awaitable[None]], on_poison: PoisonHandler | None,
                description: str) -> None:
        """`handler` takes `durable`'s facts; `on_poison` records one given up on (None: it is only logged)."""
        self.declared[durable.name] = _Declared(durable, on_poison)
        self.subscriber(
            durable.subject, stream=JStream(durable.stream, declare=False), durable=durable.name,
            config=durable.consumer_config(), pull_sub=ONE_AT_A_TIME, ack_policy=AckPolicy.MANUAL, no_reply=True,
            title=f"{durable.name}:{durable.subject}", description=description)(handler)

    def follows(self, follower: LogFollower) -> None:
        """Declare a fold of the log; the service runs it (`eventlog.follow`) from its own start sequence."""
        self.followers.append(follower)

    def emits(self, *contracts: type[Event]) -> None:
        """Declare the facts the service publishes (through `EventBus.publish`), for the AsyncAPI document."""
        for contract in contracts:
            self.publisher(fact_filter(contract), schema=contract, title=f"{self.service}:{fact_filter(contract)}",
                           description=inspect.cleandoc(contract.__doc__ or "") or None)

    def _delivery(self, msg: Any, /, *, context: ContextRepo) -> "_Delivery":
        return _Delivery(msg, context=context, router=self)


class _Delivery(BaseMiddleware):
    """One delivery of one message, from its arrival to its ack, nak or term."""

    def __init__(self, msg: Any, /, *, context: ContextRepo, router: ServiceRouter) -> None:
        super().__init__(msg, context=context)
        self.router = router
        self.message: Msg = msg
        self.declared = router.declared.get(msg.metadata.consumer or "") if isinstance(msg, Msg) else None
        self.keepalive: asyncio.Task[None] | None = None
        self.span: AbstractContextManager[Span] | None = None
        self.batch_token: Any = None

    async def on_receive(self) -> None:
        if self.declared is None:
            return
        message, policy = self.message, self.declared.durable.policy
        self.keepalive = asyncio.create_task(_keep_in_progress(message, policy.ack_wait_s / 3))
        metadata = message.metadata
        metrics.CONSUMER_PENDING.labels(metadata.consumer or "").set(metadata.num_pending or 0)
        batch_id = _batch_of(message)
        self.batch_token = BATCH_ID.set(batch_id)
        # The handler continues the trace of whoever published the message; what it publishes joins it too.
        self.span = _handler_span(self.router.tracer, message, self.declared.durable)
        span = self.span.__enter__()
        if batch_id:
            span.set_attribute("sheshnag.batch_id", batch_id)

    async def after_processed(self, exc_type: type[BaseException] | None = None,
                              exc_val: BaseException | None = None,
                              exc_tb: TracebackType | None = None) -> bool | None:
        if self.declared is None:
            return False
        try:
            if isinstance(exc_val, asyncio.CancelledError):
                return False  # stopping: the message is redelivered after its ack wait
            if exc_val is None:
                await self.message.ack_sync()
            elif isinstance(exc_val, Exception):
                await self._failed(exc_val)
            return exc_val is None or isinstance(exc_val, Exception)
        finally:
            if self.keepalive is not None:
                self.keepalive.cancel()
            if self.span is not None:
                self.span.__exit__(exc_type, exc_val, exc_tb)
            BATCH_ID.reset(self.batch_token)

    async def _failed(self, error: Exception) -> None:
        assert self.declared is not None
        message, policy = self.message, self.declared.durable.policy
        deliveries = message.metadata.num_delivered or 1
        fact = self._decoded()
        if fact is None or isinstance(error, PoisonMessage) or 0 < policy.max_deliver <= deliveries:
            log.error("giving up on %s after %d deliveries", message.subject, deliveries, exc_info=error)
            if await self._poisoned(fact, error):
                await message.term()
                return
        delay = policy.retry_delays_s[min(deliveries - 1, len(policy.retry_delays_s) - 1)]
        log.warning("handler failed on %s (delivery %d), retry in %.1fs: %r", message.subject, deliveries, delay,
                    error)
        await message.nak(delay=delay)

    def _decoded(self) -> BaseModel | None:
        """The payload as its contract; None when it is not one (a retry would meet the same bytes)."""
        assert self.declared is not None
        try:
            return self.declared.durable.contract.model_validate_json(self.message.data)
        except Exception:  # a contract's own validators may raise more than ValidationError (a KeyError)
            return None

    async def _poisoned(self, fact: BaseModel | None, error: Exception) -> bool:
        """Whether the fact given up on is recorded (or has no one to record it): only then is it terminated."""
        assert self.declared is not None
        if self.declared.on_poison is None:
            return True
        try:
            await self.declared.on_poison(fact, error, self.context.resolve(self.router.dependencies))
        except Exception:
            # Terminated unrecorded, the fact would be lost (a batch left validating): a next delivery, if any, retries.
            log.exception("the poison handler of %s failed; the message is retried", self.declared.durable.name)
            return False
        return True


def _handler_span(tracer: Tracer, message: Msg, durable: Durable) -> AbstractContextManager[Span]:
    """Named after the subscription's filter (`handle evt.batch.*.created`): span names stay few, ids go in
    attributes."""
    metadata = message.metadata
    return tracer.start_as_current_span(
        f"handle {durable.subject}", context=extract_context(message.headers),
        kind=SpanKind.CONSUMER, attributes={"messaging.destination.name": message.subject,
                                            "messaging.consumer.group.name": metadata.consumer or "",
                                            "messaging.message.delivery_count": metadata.num_delivered or 0})
