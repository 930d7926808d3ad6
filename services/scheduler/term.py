"""One leadership term of the scheduler: the book folded from the whole log, decisions acted on every tick, and the
answerers (registration, object URLs, the fact desk) judging on that term's book. Every act is an idempotent publish."""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.context import Context
from pydantic import ValidationError

from contracts.catalogue import Catalogue
from contracts.commands import FinalizeBatch, RunBatch
from contracts.events.batch import (
    AttemptFailed,
    BatchAssigned,
    BatchCancelRequested,
    BatchReleased,
    BatchValidated,
    BatchWaiting,
    ShardFinished,
    ShardLayout,
)
from contracts.events.envelope import Event
from contracts.events.executor import ExecutorLost, ExecutorRegistered
from contracts.events.registry import AnyEvent, decode_event
from contracts.ids import derived_id
from contracts.lifecycle import ENDING_FACTS
from contracts.subjects import EVENTS_STREAM, batch_fact, parse_event_subject
from services.runtime.nats.broker import BROKER_HICCUPS
from services.runtime.nats.bus import EventBus, Fence, FenceMoved
from services.runtime.nats.fleet import Fleet
from services.runtime.nats.folds import Folds
from services.runtime.nats.follower import Fact
from services.runtime.nats.kv import ScanFailed, ensure_direct_reads
from services.runtime.nats.leader import LeaderLease
from services.runtime.nats.readmodel import ReadModel
from services.runtime.process.skip_log import SkipLog
from services.runtime.process.tasks import cancel_and_join
from services.scheduler.actions import Action, Assign, DeclareLost, FenceAttempt, Finalize, Policy, StopRevoked, Wait
from services.scheduler.book import CONTROL_PLANE, BatchPlan, Book
from services.scheduler.closer import Closer
from services.scheduler.decisions import decide
from services.scheduler.desk import FactDesk
from services.scheduler.durable_sweep import DurableSweep
from services.scheduler.objects import ObjectBroker, ObjectSigner
from services.scheduler.observe import action_span, export_book, note_action, remember_trace
from services.scheduler.registration import Registrar
from services.scheduler.standings import STANDINGS_EVERY_MS, standing_waits

log = logging.getLogger(__name__)
TICK_HICCUPS = (*BROKER_HICCUPS, ScanFailed)
"""What a tick meets while the broker cannot answer for a moment (a scan of the executors broken off too): the
next tick tries again, the term goes on."""

READER_STOP_S = 10.0
_NUDGING: tuple[type[Event], ...] = (BatchValidated, BatchReleased, BatchCancelRequested, AttemptFailed,
                                     ShardFinished, ExecutorRegistered, *ENDING_FACTS)
NUDGES = frozenset((fact.kind, fact.name) for fact in _NUDGING)
"""Facts after which there may be something to do at once: the next tick comes as soon as one is folded."""
EXPORT_EVERY_MS = 1_000
"""How often a tick sets the batches gauge (scraped every few seconds at most)."""
MIN_TICK_GAP_S = 0.02
"""Nudged ticks are at least this far apart: a burst of facts is decided on together."""


@dataclass
class Term:
    bus: EventBus
    fleet: Fleet
    catalogue: Catalogue
    read_model: ReadModel
    signer: ObjectSigner
    policy: Policy = field(default_factory=Policy)
    book: Book = field(default_factory=Book)
    caught_up: asyncio.Event = field(default_factory=asyncio.Event)
    nudged: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when a fact folded since the last tick may call for an act now (`NUDGES`)."""
    unfolded: SkipLog = field(default_factory=lambda: SkipLog(log, "left out"))
    """Facts whose rule raised, said at most once a minute per sequence (a fact is folded again each term)."""
    traces: dict[str, Context] = field(default_factory=dict)
    """Each open batch's latest trace context, so what the scheduler does for it joins the batch's trace."""
    standings_at_ms: int = 0
    """When the batches' standings were last worked out."""
    exported_at_ms: int = 0
    """When the batches gauge was last set."""
    listening_since_ms: int = 0
    """When this term first looked at the fleet (its first tick): executors get an advert's lifetime from then to be
    heard before any is taken for lost."""
    lease: LeaderLease | None = field(default=None, init=False)
    """The lease this term leads on (set by `lead`): no decision is acted on once it may be lost."""
    registrar: Registrar = field(init=False)
    """Only the leader, whose book knows the fleet and who runs what, admits executors, signs object URLs, stores
    executors' facts and ends the batches no executor can end."""
    objects: ObjectBroker = field(init=False)
    desk: FactDesk = field(init=False)
    closer: Closer = field(init=False)
    sweep: DurableSweep = field(init=False)
    """Deletes the durables of executors gone for good."""

    def __post_init__(self) -> None:
        self.registrar = Registrar(self.bus, self.read_model, self.book, self.caught_up)
        self.objects = ObjectBroker(self.signer, self.book, self.caught_up)
        self.desk = FactDesk(self.bus, self.book, self.caught_up, self.catalogue, self.signer.store)
        self.closer = Closer(self.bus, self.signer.store, is_open=lambda batch_id: batch_id in self.book.open)
        self.sweep = DurableSweep(self.bus, self.registrar.one_at_a_time)

    @classmethod
    async def open(cls, bus: EventBus, catalogue: Catalogue, signer: ObjectSigner, policy: Policy) -> "Term":
        await ensure_direct_reads(bus.js, EVENTS_STREAM)  # the desk reads logs; a stream made before direct reads
        return cls(bus, await Fleet.open(bus), catalogue, await ReadModel.open(bus), signer, policy)

    async def lead(self, lease: LeaderLease, tick_s: float, stop: asyncio.Event, folds: Folds) -> None:
        """Decisions every tick once the book (`folds`) caught up, until stopped, the lease lost or the fold failed."""
        keeper = asyncio.create_task(lease.keep(stop))
        self.lease = lease
        resent = False
        try:
            while not stop.is_set() and not keeper.done() and not folds.ended():
                # A term resumed after a pause past its lease's TTL acts on nothing until its keeper renews it (or
                # finds it lost): a standby may lead by now, and two leaders would both assign.
                if self.caught_up.is_set() and not lease.lost():
                    self.nudged.clear()
                    try:
                        if not resent:
                            await self.resend_runs()
                            resent = True
                        await self.tick()
                    except TICK_HICCUPS as hiccup:
                        # A stream electing a leader answers nothing for seconds: acts are idempotent publishes.
                        log.warning("a tick could not finish (%s: %s); trying again next tick",
                                    type(hiccup).__name__, hiccup)
                        resent = False  # an assignment stated but its command not sent: send every run again
                await self._until_next_tick(stop, tick_s, keeper)
        finally:
            await self.closer.stop()
            if await cancel_and_join([keeper], READER_STOP_S):
                raise TimeoutError(f"the term's lease keeper did not stop within {READER_STOP_S}s")
        if (failure := folds.failure()) is not None:
            log.error("the book's fold failed; the term ends", exc_info=failure)
        elif not stop.is_set():
            log.warning("leadership lost; back to standby")

    async def _until_next_tick(self, stop: asyncio.Event, tick_s: float, keeper: asyncio.Task[None]) -> None:
        """The tick interval, cut short by a nudge, the stop or the lease's loss (the keeper ending)."""
        await asyncio.sleep(MIN_TICK_GAP_S)
        woken = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self.nudged.wait())]
        try:
            await asyncio.wait([*woken, keeper], timeout=max(tick_s - MIN_TICK_GAP_S, 0),
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in woken:
                waiter.cancel()

    def fold(self, facts: list[Fact]) -> None:
        """Facts of the log into the book, in stream order; a fact in `NUDGES` nudges the next tick."""
        for fact in facts:
            subject = parse_event_subject(fact.subject)
            if subject is None:
                log.warning("sequence %d is on %s, not an event subject; skipped", fact.sequence, fact.subject)
                continue
            try:
                event = decode_event(fact.data)
            except ValidationError:
                log.warning("sequence %d is not an event this scheduler knows; skipped", fact.sequence)
                continue
            try:
                self.book.apply(event)
            except Exception as error:  # a fact no rule foresaw: it leaves its batch as it was, never the book
                self.unfolded.skipped(f"sequence {fact.sequence}", f"{event.type} of {event.aggregate_id} could not "
                                      f"be folded into the book ({error!r}); left out")
                log.debug("folding sequence %d failed", fact.sequence, exc_info=True)
                continue
            if subject.kind == "batch":  # a trace is kept for an open batch only, whatever comes after its end
                if subject.aggregate_id in self.book.open:
                    remember_trace(self.traces, subject.aggregate_id, subject.name, fact.headers)
                else:
                    self.traces.pop(subject.aggregate_id, None)
            if isinstance(event, ENDING_FACTS):
                self.closer.forget(event.aggregate_id)
            if (subject.kind, subject.name) in NUDGES:
                self.nudged.set()

    async def tick(self) -> None:
        adverts = await self.fleet.adverts()
        self.book.note_heartbeats(adverts)
        now_ms = int(time.time() * 1000)
        for executor_id in set(self.book.known_executors) - {advert.executor_id for advert in adverts}:
            log.info("no advert of executor %s in the executors bucket (last heartbeat %d ms ago)", executor_id,
                     now_ms - self.book.known_executors[executor_id])
        self.listening_since_ms = self.listening_since_ms or now_ms
        for action in decide(self.book, adverts, self.catalogue, now_ms, self.policy, self.book.rates.rates(now_ms),
                             self.listening_since_ms):
            if self.lease is not None and self.lease.lost():
                return  # paused past the lease meanwhile: the rest is decided again by whoever leads
            await self.act(action)
        if now_ms - self.exported_at_ms >= EXPORT_EVERY_MS:
            self.exported_at_ms = now_ms  # O(open batches): once a second, not every nudged tick
            export_book(self.book)
        await self.sweep.run(self.book, {advert.executor_id for advert in adverts}, now_ms)
        if now_ms - self.standings_at_ms >= STANDINGS_EVERY_MS:
            self.standings_at_ms = now_ms
            for wait in standing_waits(self.book, self.policy.weights, now_ms):
                await self.act(wait)

    async def act(self, action: Action) -> None:
        with action_span(self.traces, action):
            await ACTS[type(action)](self, action)

    async def _state(self, fact: AnyEvent) -> None:
        await self.bus.publish(fact)
        self.book.apply(fact)  # act on our own fact now; the log delivers it again, harmlessly

    async def _wait(self, action: Wait) -> None:
        await self._state(BatchWaiting(aggregate_id=action.plan.batch_id, reason=action.reason,
                                       as_of=int(time.time() * 1000)))

    async def _fence(self, action: FenceAttempt) -> None:
        await self._state(AttemptFailed(aggregate_id=action.plan.batch_id, attempt=action.attempt,
                                        executor_id=action.executor_id, code=action.code, reason=action.reason))
        note_action(action)

    async def _declare_lost(self, action: DeclareLost) -> None:
        log.warning("executor %s is lost (last heartbeat %d)", action.executor_id, action.last_heartbeat_at)
        await self._state(ExecutorLost(aggregate_id=action.executor_id, last_heartbeat_at=action.last_heartbeat_at))
        note_action(action)

    async def _finalize(self, action: Finalize) -> None:
        """To the executor chosen, on its own durable; or to the control plane's own finalizer."""
        plan = action.plan
        command = FinalizeBatch(
            batch_id=plan.batch_id, executor_id=action.executor_id or CONTROL_PLANE, reason=action.reason,
            terms=plan.terms, unrun_code=plan.cancel_code if action.reason == "cancelled" else None,
            failure_code=action.failure_code, failure_message=action.failure_message)
        plan.finalizer = command.executor_id
        if action.executor_id is None:
            def given_up() -> None:
                if plan.finalizer == CONTROL_PLANE:
                    plan.finalizer = None  # decided again next tick
            self.closer.close(command, given_up)
        else:
            await self.send(command)
            log.info("batch %s (%s) sent to %s to finalize", plan.batch_id, action.reason, action.executor_id)

    async def _stop_revoked(self, action: StopRevoked) -> None:
        stop = BatchCancelRequested(aggregate_id=action.plan.batch_id, requested_by_key_id=REVOCATION,
                                    code="authorization_revoked")
        try:
            await self.bus.publish(stop, fence=Fence(batch_fact(stop.aggregate_id, "finalizing"), 0))
        except FenceMoved:
            return  # finalizing already: it ends as it is
        self.book.apply(stop)
        log.info("batch %s stopped: its key %s was revoked", stop.aggregate_id, action.plan.terms.owner_key_id)

    async def _assign(self, action: Assign) -> None:
        """The fact first, then the command: a leader that dies between them has the next one resend it."""
        plan = action.plan
        retry = action.shard in plan.retry_units
        assigned = BatchAssigned(aggregate_id=plan.batch_id, executor_id=action.executor_id, attempt=action.attempt,
                                 lease_token=_lease_token(plan.batch_id, action.attempt), shard=action.shard,
                                 shards=action.layout.shards, shard_span=action.layout.span)
        try:  # never after a cancel the book has not folded yet: the ledger would refuse it as an anomaly
            await self.bus.publish(assigned, fence=Fence(batch_fact(plan.batch_id, "cancel_requested"), 0))
        except FenceMoved:
            log.info("batch %s unit %d not assigned: its cancel came first", plan.batch_id, action.shard + 1)
            return
        self.book.apply(assigned)
        note_action(action, retry)
        await self._send_run(plan, action.executor_id, action.attempt, action.shard)
        log.info("batch %s unit %d/%d attempt %d assigned to %s", plan.batch_id, action.shard + 1,
                 action.layout.shards, action.attempt, action.executor_id)

    async def resend_runs(self) -> None:
        """Once per term: every running attempt's run command again, in case the last leader died before sending it."""
        for plan in list(self.book.open.values()):  # the fold goes on while each command is sent
            for shard, run in plan.running_shards():
                assert run.executor_id is not None
                await self._send_run(plan, run.executor_id, run.attempt, shard)

    async def _send_run(self, plan: BatchPlan, executor_id: str, attempt: int, shard: int) -> None:
        assert plan.model is not None
        await self.send(RunBatch(
            batch_id=plan.batch_id, executor_id=executor_id, attempt=attempt,
            lease_token=_lease_token(plan.batch_id, attempt), terms=plan.terms, model=plan.model,
            total_lines=plan.total_lines, rejections_object_key=plan.rejections_object_key, shard=shard,
            layout=plan.layout or ShardLayout()))

    async def send(self, command: RunBatch | FinalizeBatch) -> None:
        """In the newest shape the executor takes (flat, protocol 1, to one that never said)."""
        await self.bus.send(command, self.book.protocols.get(command.executor_id, 1))


REVOCATION = "revocation"
"""The `requested_by_key_id` of a cancel the scheduler states for a revoked key's batch."""


def _lease_token(batch_id: str, attempt: int) -> str:
    return derived_id("lease_", batch_id, str(attempt))


ACTS: dict[type, Callable[[Term, Any], Awaitable[None]]] = {
    Assign: Term._assign, Wait: Term._wait, FenceAttempt: Term._fence, DeclareLost: Term._declare_lost,
    Finalize: Term._finalize, StopRevoked: Term._stop_revoked}
"""How the term carries out each action `decide` returns."""
