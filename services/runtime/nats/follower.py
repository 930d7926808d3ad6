"""Reading EVENTS in stream order with an ephemeral pull consumer: nothing arrives faster than it is taken. (A push
consumer drops messages once its pending limit fills, and nats-py's ordered consumer never notices the gap.) The
reader asks for at most two batches ahead, and any gap or silence restarts the consumer after the last fact handed on.
"""

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass, field

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, Header

from contracts.subjects import EVENTS_STREAM, EVENTS_SUBJECTS, consumer_next
from services.runtime.nats.bus import EventBus

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class Fact:
    """One stream message as stored: its sequence, subject and payload bytes."""

    sequence: int
    subject: str
    data: bytes
    headers: Mapping[str, str] | None = field(default=None, compare=False)
    """The message's headers (the publisher's trace context among them), when read from the stream."""


PULL_EXPIRES_S = 1.0
"""A pull request lasts this long at the head of the stream; the server then answers 408 and a new one goes."""
SILENCE_S = 5.0
"""No message and no expiry notice for this long: the requests or the consumer are lost (restart, reconnect)."""
INACTIVE_S = 60.0
"""The server drops a consumer nobody pulls from for this long (a process that died without deleting it)."""
RESTART_DELAY_S = 0.5
PENDING_MESSAGES = "Nats-Pending-Messages"
REQUEST_TIMEOUT = "408"


class ReaderInterrupted(Exception):
    """The consumer skipped a delivery, went away or fell silent: the reader starts over."""


class OrderedReader:
    """Pulls facts from `start_after + 1` on and hands them on in stream order, each exactly once."""

    def __init__(self, bus: EventBus, start_after: int, batch: int = 1000,
                 subject: str | tuple[str, ...] = EVENTS_SUBJECTS) -> None:
        self.bus = bus
        self.subject = subject
        """One subject filter, or several (the facts of a fold's table: the server sends only those)."""
        self.batch = batch
        self.read_through = start_after
        """Every fact up to this stream sequence has been handed on."""
        self.head_seen = start_after
        """The stream's last sequence as the latest delivery reported it (for lag metrics)."""
        self.consumer = ""
        """The server's name of the consumer being read ("" until it is made)."""
        self._subscription: Subscription | None = None
        self._inbox = ""
        self._arrived: list[Fact] = []
        self._wake = asyncio.Event()
        self._failure: ReaderInterrupted | None = None
        self._requested = 0
        self._delivered = 0
        self._last_stream = start_after

    async def groups(self, idle: bool = False) -> AsyncGenerator[list[Fact], None]:
        """The facts in groups as they arrive, for ever (the one restart loop of every follower of the log): any trouble
        restarts the consumer where the last group ended. `idle`: a quiet spell or a restart yields an empty group."""
        while True:
            try:
                facts = await self.next_facts()
            except (ReaderInterrupted, nats.errors.Error, nats.js.errors.Error, OSError) as error:
                log.warning("event reader restarts after sequence %d: %r", self.read_through, error)
            except Exception:
                # Whatever else went wrong, a reader that gave up would leave its follower silently behind.
                log.exception("event reader failed after sequence %d; it restarts", self.read_through)
            else:
                if facts or idle:
                    yield facts
                continue
            await self.close()
            await asyncio.sleep(RESTART_DELAY_S)
            if idle:
                yield []

    async def next_facts(self) -> list[Fact]:
        """The facts that arrived since the last call, in stream order; none after `PULL_EXPIRES_S` at the head."""
        if self._subscription is None:
            await self._open()
        await self._top_up()
        try:
            await asyncio.wait_for(self._wake.wait(), SILENCE_S)
        except TimeoutError as error:
            raise ReaderInterrupted(f"nothing from consumer {self.consumer} for {SILENCE_S}s") from error
        self._wake.clear()
        if self._failure is not None:
            raise self._failure
        facts, self._arrived = self._arrived, []
        if facts:
            self.read_through = facts[-1].sequence
        return facts

    @contextlib.asynccontextmanager
    async def reading(self, idle: bool = False, *,
                      consumer_first: bool = False) -> AsyncIterator[AsyncIterator[list[Fact]]]:
        """`groups`, with the consumer released when the block ends. `consumer_first`: it is made before the block
        runs (nothing published from then on can be missed); else at the first group."""
        try:
            if consumer_first:
                await self._open()
            async with contextlib.aclosing(self.groups(idle)) as groups:
                yield groups
        finally:
            await self.close()

    async def close(self) -> None:
        subscription, self._subscription = self._subscription, None
        if subscription is None:
            return
        with contextlib.suppress(nats.errors.Error, nats.js.errors.Error, OSError):
            await subscription.unsubscribe()
        # Deleted whether or not the unsubscribe went (a draining connection refuses it, yet still sends requests).
        await self._delete_consumer()

    async def _delete_consumer(self) -> None:
        with contextlib.suppress(nats.errors.Error, nats.js.errors.Error, OSError):
            await self.bus.js.delete_consumer(EVENTS_STREAM, self.consumer)

    async def _open(self) -> None:
        subjects = (self.subject,) if isinstance(self.subject, str) else self.subject
        filters = {"filter_subject": subjects[0]} if len(subjects) == 1 else {"filter_subjects": list(subjects)}
        config = ConsumerConfig(**filters, deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                                opt_start_seq=self.read_through + 1, ack_policy=AckPolicy.NONE,
                                inactive_threshold=INACTIVE_S, mem_storage=True, num_replicas=1)
        info = await self.bus.js.add_consumer(EVENTS_STREAM, config)
        self.consumer = info.name
        self._arrived, self._failure, self._wake = [], None, asyncio.Event()
        self._requested, self._delivered, self._last_stream = 0, 0, self.read_through
        self._inbox = self.bus.nc.new_inbox()
        try:
            self._subscription = await self.bus.nc.subscribe(self._inbox, cb=self._arrive)
        except BaseException:  # the consumer is made but nobody will read it: it goes now, not after INACTIVE_S
            await asyncio.shield(self._delete_consumer())
            raise

    async def _top_up(self) -> None:
        """Keep two batches asked for: one arriving while the one before is folded, never more than that."""
        while self._requested <= self.batch:
            request = b'{"batch":%d,"expires":%d}' % (self.batch, int(PULL_EXPIRES_S * 1e9))
            await self.bus.nc.publish(consumer_next(EVENTS_STREAM, self.consumer), request, reply=self._inbox)
            self._requested += self.batch

    async def _arrive(self, message: Msg) -> None:
        self._wake.set()
        if self._failure is not None:
            return
        headers = message.headers or {}
        status = headers.get(Header.STATUS)
        if status == REQUEST_TIMEOUT:
            # The request expired at the head of the stream; this many of it were never filled.
            self._requested -= int(headers.get(PENDING_MESSAGES, "0"))
            return
        if status is not None:
            description = headers.get(Header.DESCRIPTION, "")
            self._failure = ReaderInterrupted(f"consumer {self.consumer} answered {status} {description}")
            return
        metadata = message.metadata  # parsed from the reply subject on every access
        sequence = metadata.sequence
        if sequence.consumer != self._delivered + 1 or sequence.stream <= self._last_stream:
            self._failure = ReaderInterrupted(f"delivery {sequence.consumer} (stream {sequence.stream}) after "
                                              f"{self._delivered} (stream {self._last_stream})")
            return
        self._requested -= 1
        self._delivered, self._last_stream = sequence.consumer, sequence.stream
        self.head_seen = max(self.head_seen, sequence.stream + (metadata.num_pending or 0))
        self._arrived.append(Fact(sequence.stream, message.subject, message.data, message.headers))
