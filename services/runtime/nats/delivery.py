"""A service's table (`ServiceRouter`): durable subscriptions on faststream under one delivery policy, core
request/reply answers (answers.py), folds of the log (folds.py), and the leadership terms some of them run in.

A durable's handler is a method of the service's dependencies taking its decoded contract model; the policy acks only
when it returns, keeps a long handler's lease, retries a failure with backoff, and on the last delivery (or at once on
`PoisonMessage`) hands the fact to the poison handler, then terminates it. A payload that is not its contract is
logged and terminated. Leader-only answers and folds run per term (`leading()`): faststream subscribes a core
subscriber in `start()` and forgets it in `stop()`, so each term starts them afresh; between terms a request gets
"no responders".
"""

import asyncio
import contextlib
import inspect
import logging
import time
import typing
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Annotated, Any

import nats.errors
import orjson
from faststream import BaseMiddleware, ContextRepo
from faststream.middlewares import AckPolicy
from faststream.nats import JStream, NatsBroker, NatsRouter, PullSub
from nats.aio.msg import Msg
from nats.js.api import AckPolicy as JetStreamAck
from nats.js.api import ConsumerConfig, DeliverPolicy
from opentelemetry.trace import Span, SpanKind
from pydantic import BaseModel, TypeAdapter

from contracts.events.envelope import Event
from contracts.subjects import BATCH_HEADER, event_subject, parse_event_subject, subject_pattern
from services.runtime.nats.answers import Answer, Answering, RawAnswer, RawHandler, Refused
from services.runtime.nats.bus import EXPECTED_WAITS, ConsumerPolicy, EventBus, NotYet, PoisonMessage
from services.runtime.nats.folds import Folds, LogFollower, running
from services.runtime.process import metrics
from services.runtime.process.logfmt import BATCH_ID
from services.runtime.process.params import Context
from services.runtime.process.tasks import cancel_and_join
from services.runtime.process.telemetry import extract_context, tracer
from services.runtime.storage.write_failures import FAULT_PATIENCE_S, WriteFault, write_fault

log = logging.getLogger(__name__)
__all__ = ["TERM", "Answer", "Durable", "Handler", "LogFollower", "PoisonHandler", "RawAnswer", "Refused",
           "ServiceRouter", "batch_of", "fact_filter", "keep_in_progress"]

Handler = Callable[[Any, Any], Awaitable[None]] | Callable[[Any, Any, int], Awaitable[None]]
"""A durable's handler: (the service's dependencies, the decoded fact or command[, its stream sequence])."""
PoisonHandler = Callable[[Any, Any, BaseException], Awaitable[None]]
"""(the service's dependencies, the decoded fact given up on, the error): `Executor.fail_the_attempt`."""

RELEASE_S = 1.0
"""How long a stopping service spends giving back one fact in hand (`ConsumerPolicy.release_on_stop`)."""
ACK_CONFIRM_S = 5.0
"""How long an ack waits for JetStream to confirm it (an admitted executor's goes through a scheduler's relay)."""
ONE_AT_A_TIME = PullSub(batch_size=1, timeout=1.0)
"""Fetch one message at a time: with one worker (the default) it is handled before the next is fetched; with
`max_workers` each goes to a worker of its own as it arrives (never waiting unkept for a free one)."""


def fact_filter(contract: type[Event]) -> str:
    """Every fact of this type, whatever its aggregate: `BatchCreated` → `evt.batch.*.created`."""
    return event_subject(contract.kind, "*", contract.name)


@dataclass(frozen=True)
class Durable:
    """A durable pull consumer of one contract: its stream, name, filter(s) and delivery policy."""

    contract: Any
    """A model, or a union of facts discriminated by `type` (a consumer with several filters)."""
    stream: str
    name: str
    subject: str
    """Its single filter; "" when it has several (`filter_subjects`)."""
    policy: ConsumerPolicy = field(default_factory=ConsumerPolicy)
    filter_subjects: tuple[str, ...] = ()
    """Several filters on one consumer, with one ack floor. They travel in the request's body, where authorization
    cannot pin them: a service's own consumer (the gateways' webhook intake), never an executor's."""

    def consumer_config(self) -> ConsumerConfig:
        # Named: a single filter then travels in the API subject, where authorization can pin it.
        return ConsumerConfig(name=self.name, durable_name=self.name, filter_subject=self.subject or None,
                              filter_subjects=list(self.filter_subjects) or None,
                              ack_policy=JetStreamAck.EXPLICIT, deliver_policy=DeliverPolicy.ALL,
                              ack_wait=self.policy.ack_wait_s,
                              max_deliver=-1 if self.policy.redeliver_forever else self.policy.max_deliver,
                              max_ack_pending=self.policy.max_ack_pending)


TERM = "term"
"""The name a leader-only answer's handler takes its term's dependencies by (a `Context()` parameter)."""


@dataclass(frozen=True)
class _Declared:
    durable: Durable
    on_poison: PoisonHandler | None
    description: str


class ServiceRouter(NatsRouter):
    """One service's table of durable subscriptions. `dependencies` names the service's object in faststream's
    context: handlers take it as a `Context()` parameter of that name, poison handlers as their third argument."""

    def __init__(self, service: str, dependencies: str) -> None:
        self.service = service
        self.dependencies = dependencies
        self.tracer = tracer(service)
        self.declared: dict[str, _Declared] = {}
        self.followers: list[LogFollower] = []
        self.answered: list[Answer[Any]] = []
        """Every answer declared (for the AsyncAPI document)."""
        self.answering: set[object] = set()
        """The subscribers of answers (each request through `Answering`); `untraced`: those without a span."""
        self.untraced: set[object] = set()
        self.term = NatsRouter(middlewares=[self._answering])
        """The leader-only answers: never included before the broker starts (see `leading`)."""
        super().__init__(middlewares=[self._delivery])

    def durable(self, durable: Durable, handler: Handler, on_poison: PoisonHandler | None, description: str,
                max_workers: int = 1) -> None:
        """`handler` takes `durable`'s facts; `on_poison` records one given up on (None: it is only logged).
        `max_workers` > 1: that many handled at once. A fetched message waits for a free worker with no lease kept,
        so `max_ack_pending` may not exceed `max_workers`."""
        if max_workers > 1 and durable.policy.max_ack_pending > max_workers:
            raise ValueError(f"{durable.name}: {durable.policy.max_ack_pending} messages out for {max_workers} "
                             "workers would leave some fetched unattended, their ack wait running")
        self.declared[durable.name] = _Declared(durable, on_poison, description)
        self.subscriber(
            durable.subject, stream=JStream(durable.stream, declare=False), durable=durable.name,
            config=durable.consumer_config(), pull_sub=ONE_AT_A_TIME, ack_policy=AckPolicy.MANUAL, no_reply=True,
            max_workers=max_workers, title=f"{durable.name}:{durable.subject or ','.join(durable.filter_subjects)}",
            description=description, include_in_schema=not durable.filter_subjects,  # no single contract to show
        )(_delivered_to(handler, durable.contract, self.dependencies))

    def follows(self, follower: LogFollower) -> None:
        """Declare a fold of the log, run for each term (leader-only: `leading`) or while the service runs
        (`folding`); one without a handler is run by the service itself."""
        self.followers.append(follower)

    @contextlib.asynccontextmanager
    async def folding(self, bus: EventBus, deps: object) -> AsyncIterator[Folds]:
        """The folds that run while the service does (not leader-only), on `deps`, until the block ends."""
        async with running([f for f in self.followers if f.take and not f.leader_only], bus, deps) as folds:
            yield folds

    def answers(self, answer: Answer[Any] | RawAnswer, handler: Callable[..., Awaitable[BaseModel]] | RawHandler,
                description: str) -> None:
        """`handler` takes `answer`'s request (and `Path()`/`Context()` parameters) and returns the reply; a
        leader-only one takes its term's dependencies as `Context(TERM)`. A raw answer's: see `RawHandler`."""
        title = f"{self.service}:{answer.subject}"
        if isinstance(answer, RawAnswer):
            subscriber = self.subscriber(answer.subject, queue=answer.queue, no_reply=True, title=title,
                                         description=description, include_in_schema=False)
            raw = Annotated[Msg, Context("message.raw_message")]  # no contract: the request as nats-py received it
            subscriber(_delivered_to(typing.cast(RawHandler, handler), raw, self.dependencies))
            if not answer.traced:
                self.untraced.add(subscriber)
        else:
            router = self.term if answer.leader_only else self
            subscriber = router.subscriber(answer.subject, queue=answer.queue, decoder=answer.decoder, title=title,
                                           description=description)
            subscriber(handler)
            self.answered.append(answer)
        self.answering.add(subscriber)

    @contextlib.asynccontextmanager
    async def leading(self, broker: NatsBroker, term: object, bus: EventBus | None = None) -> AsyncIterator[Folds]:
        """One leadership term: the leader-only folds run and answers are subscribed, on `term`'s dependencies, until
        the block ends (a request being answered is finished first). `bus`: what the folds read the log through."""
        followers = [follower for follower in self.followers if follower.take and follower.leader_only]
        if followers and bus is None:
            raise ValueError(f"{self.service}: a term's folds need the bus to read the log through")
        broker.include_router(self.term)  # once: the broker's own start never saw it
        broker.context.set_global(TERM, term)
        subscribers = self.term.subscribers
        try:
            async with running(followers, bus, term) if bus is not None else contextlib.nullcontext(Folds(())) as folds:
                for subscriber in subscribers:
                    await subscriber.start()
                await (await broker.connect()).flush()  # the server routes requests here before the term acts
                yield folds
        finally:
            for subscriber in subscribers:
                with contextlib.suppress(nats.errors.Error):  # a closed connection has dropped them already
                    await subscriber.stop()
            broker.context.reset_global(TERM)

    def emits(self, *contracts: type[Event]) -> None:
        """Declare the facts the service publishes (through `EventBus.publish`), for the AsyncAPI document."""
        for contract in contracts:
            self.publisher(fact_filter(contract), schema=contract, title=f"{self.service}:{fact_filter(contract)}",
                           description=inspect.cleandoc(contract.__doc__ or "") or None)

    def _delivery(self, msg: Any, /, *, context: ContextRepo) -> BaseMiddleware:
        if context.get_local("handler_") in self.answering:
            return self._answering(msg, context=context)
        return _Delivery(msg, context=context, router=self)

    def _answering(self, msg: Any, /, *, context: ContextRepo) -> Answering:
        untraced = context.get_local("handler_") in self.untraced
        return Answering(msg, context=context, tracer=None if untraced else self.tracer)


def _delivered_to(handler: Handler, contract: Any, dependencies: str) -> Callable[..., Awaitable[None]]:
    """faststream's subscriber function for `handler`: the message decoded as `contract`, the dependencies from the
    broker's context by name, and for a handler of three parameters the fact's stream sequence."""
    call: Any = handler  # of two parameters or three, told apart here once

    async def unplaced(message: Any, deps: Any) -> None:
        await call(deps, message)

    async def placed(message: Any, deps: Any, sequence: int) -> None:
        await call(deps, message, sequence)

    takes_sequence = len(inspect.signature(handler).parameters) == 3
    deliver: Callable[..., Awaitable[None]] = placed if takes_sequence else unplaced
    deliver.__annotations__ = {"message": contract, "deps": Annotated[Any, Context(dependencies)], "return": None}
    if takes_sequence:
        deliver.__annotations__["sequence"] = Annotated[int, Context("message.raw_message.metadata.sequence.stream")]
    deliver.__name__ = deliver.__qualname__ = getattr(handler, "__name__", "deliver")
    deliver.__doc__ = handler.__doc__
    return deliver


class _Delivery(BaseMiddleware):
    """One delivery of one message, from its arrival to its ack, nak or term."""

    def __init__(self, msg: Any, /, *, context: ContextRepo, router: ServiceRouter) -> None:
        super().__init__(msg, context=context)
        self.router = router
        self.message: Msg = msg
        self.declared = router.declared.get(msg.metadata.consumer or "") if isinstance(msg, Msg) else None
        self.recording_fault: WriteFault | None = None
        """The write fault the last try to record a fact given up on met, if that is why it failed."""
        self.keepalive: asyncio.Task[None] | None = None
        self.span: AbstractContextManager[Span] | None = None
        self.batch_token: Any = None

    async def on_receive(self) -> None:
        if self.declared is None:
            return
        message, policy = self.message, self.declared.durable.policy
        self.keepalive = asyncio.create_task(keep_in_progress(message, policy.ack_wait_s / 3))
        metadata = message.metadata
        metrics.CONSUMER_PENDING.labels(metadata.consumer or "").set(metadata.num_pending or 0)
        batch_id = batch_of(message)
        self.batch_token = BATCH_ID.set(batch_id)
        # The handler continues the publisher's trace (what it publishes joins it). Span names stay few (the
        # subscription's filter: `handle evt.batch.*.created`), ids go in attributes.
        self.span = self.router.tracer.start_as_current_span(
            f"handle {subject_pattern(self.declared.durable.subject or message.subject)}",
            context=extract_context(message.headers), kind=SpanKind.CONSUMER,
            attributes={"messaging.destination.name": message.subject,
                        "messaging.consumer.group.name": metadata.consumer or "",
                        "messaging.message.delivery_count": metadata.num_delivered or 0})
        span = self.span.__enter__()
        if batch_id:
            span.set_attribute("sheshnag.batch_id", batch_id)

    async def after_processed(self, exc_type: type[BaseException] | None = None,
                              exc_val: BaseException | None = None,
                              exc_tb: TracebackType | None = None) -> bool | None:
        if self.declared is None:
            return False
        try:
            # No keep-alive after the ack or nak: relayed (an admitted executor's), one could overtake it and
            # undo a nak's delay.
            await self._stop_keepalive()
            if isinstance(exc_val, asyncio.CancelledError):
                if self.declared.durable.policy.release_on_stop:
                    await self._release()
                return False  # stopping: the message is redelivered (after its ack wait, unless released)
            if exc_val is None:
                await self.message.ack_sync(ACK_CONFIRM_S)
            elif isinstance(exc_val, Exception):
                await self._failed(exc_val)
            return exc_val is None or isinstance(exc_val, Exception)
        finally:
            if self.keepalive is not None:
                self.keepalive.cancel()
            if self.span is not None:
                self.span.__exit__(exc_type, exc_val, exc_tb)
            BATCH_ID.reset(self.batch_token)

    async def _stop_keepalive(self) -> None:
        if self.keepalive is not None:
            await cancel_and_join([self.keepalive])

    async def _release(self) -> None:
        """Give the message back for redelivery now (bounded: a broker that does not answer leaves the ack wait)."""
        try:
            await asyncio.wait_for(asyncio.shield(self.message.nak()), RELEASE_S)
        except (asyncio.CancelledError, Exception) as error:
            log.debug("%s not given back on stopping (%r): redelivered after its ack wait", self.message.subject, error)

    async def _failed(self, error: Exception) -> None:
        assert self.declared is not None
        message, policy = self.message, self.declared.durable.policy
        deliveries = message.metadata.num_delivered or 1
        fact = self._decoded()
        last = 0 < policy.max_deliver <= deliveries
        if fact is None or isinstance(error, PoisonMessage) or last:
            log.error("giving up on %s after %d deliveries", message.subject, deliveries, exc_info=error)
            recorded = await self._poisoned(fact, error)
            tries, given_up_at = 0, time.monotonic()
            while not recorded and last and self.recording_fault is not None \
                    and time.monotonic() - given_up_at < FAULT_PATIENCE_S:
                # No delivery comes after the last: while recording the fact given up fails on a write fault (the
                # broker restarting, a full disk), it is tried again here, holding the message, so that it is never
                # left neither done nor recorded. Any other failure to record it is the poison handler's for good.
                await asyncio.sleep(policy.retry_delays_s[min(tries, len(policy.retry_delays_s) - 1)])
                tries += 1
                with contextlib.suppress(nats.errors.Error):
                    await message.in_progress()
                recorded = await self._poisoned(fact, error)
            if recorded:
                await message.term()
                return
        delay = policy.retry_delays_s[min(deliveries - 1, len(policy.retry_delays_s) - 1)]
        level = logging.INFO if isinstance(error, NotYet) and deliveries <= EXPECTED_WAITS else logging.WARNING
        log.log(level, "handler failed on %s (delivery %d), retry in %.1fs: %r", message.subject, deliveries, delay,
                error)
        await message.nak(delay=delay)

    def _decoded(self) -> BaseModel | None:
        """The payload as its contract; None when it is not one (a retry would meet the same bytes)."""
        assert self.declared is not None
        try:
            return typing.cast(BaseModel, TypeAdapter(self.declared.durable.contract).validate_json(self.message.data))
        except Exception:  # a contract's own validators may raise more than ValidationError (a KeyError)
            return None

    async def _poisoned(self, fact: BaseModel | None, error: Exception) -> bool:
        """Whether the fact given up on is recorded (or has no one to record it): only then is it terminated."""
        assert self.declared is not None
        if fact is None:
            log.error("dropping a message on %s that is not a %s: %r", self.message.subject,
                      getattr(self.declared.durable.contract, "__name__", "fact it takes"), error)
            return True
        if self.declared.on_poison is None:
            return True
        try:
            await self.declared.on_poison(self.context.resolve(self.router.dependencies), fact, error)
        except Exception as failure:
            # Terminated unrecorded, the fact would be lost (a batch left validating): a next delivery, if any, retries.
            self.recording_fault = write_fault(failure)
            log.exception("the poison handler of %s failed; the message is retried", self.declared.durable.name)
            return False
        return True


def batch_of(message: Msg) -> str:
    """The batch a message is about: named in a batch fact's subject, or in a command's header."""
    fact = parse_event_subject(message.subject)
    if fact is not None:
        return fact.aggregate_id if fact.kind == "batch" else ""
    named = (message.headers or {}).get(BATCH_HEADER)
    if named is not None:
        return named
    # A command sent before commands carried the header (still queued across an upgrade): its own field.
    try:
        decoded = orjson.loads(message.data)
    except orjson.JSONDecodeError:
        return ""
    return str(decoded.get("batch_id", "")) if isinstance(decoded, dict) else ""


async def keep_in_progress(message: Msg, every_s: float) -> None:
    """Long work keeps its lease on the message instead of being redelivered to someone else."""
    while True:
        await asyncio.sleep(every_s)
        try:
            await message.in_progress()
        except (nats.errors.Error, OSError):
            return
