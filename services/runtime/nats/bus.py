"""The JetStream connection: stream declarations, deduplicated publishes, durable consumers."""

import asyncio
import contextlib
import functools
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol, Self

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import RetentionPolicy, StorageType, StreamConfig, StreamInfo

from contracts.commands import COMMAND_PROTOCOL
from contracts.events.envelope import Event
from contracts.subjects import BATCH_HEADER, EVENTS_STREAM, EVENTS_SUBJECTS, JS_API, WORK_STREAM, WORK_SUBJECTS
from services.runtime.nats.broker import GRACEFUL_STOP_S, TOOL_ATTEMPTS, Credentials, ErrorCallback, ServiceBroker
from services.runtime.nats.placement import until_placed
from services.runtime.process.settings import ConnectionSettings
from services.runtime.process.telemetry import inject_headers, tracer

log = logging.getLogger(__name__)

PUBLISH_TIMEOUT_S = 10.0
DEDUP_WINDOW_S = 3600.0
"""A retried publish within this window is recognised as the same fact."""


class Command(Protocol):
    """What the bus needs of a command (`contracts.commands`) to send it."""

    @property
    def subject(self) -> str: ...

    @property
    def msg_id(self) -> str: ...

    @property
    def batch_id(self) -> str: ...

    def wire(self, protocol: int) -> bytes: ...


class PoisonMessage(Exception):
    """A message that can never be handled; it is recorded and terminated, never retried."""


class NotYet(Exception):
    """A message that must wait for something on its way (the ledger folding its batch): retried like any failure,
    said at INFO while it has waited only `EXPECTED_WAITS` deliveries."""


EXPECTED_WAITS = 3


WRONG_LAST_SEQUENCE = 10071
"""JetStream's error code when a conditional publish's expected last sequence no longer holds."""


@dataclass(frozen=True)
class Fence:
    """A publish condition: the last fact on `subject` (a filter) is still the one at `sequence` (0: none yet).
    JetStream checks it atomically with the write: a writer whose lease a newer fact revoked writes nothing more."""

    subject: str
    sequence: int

    def headers(self) -> dict[str, str]:
        return {"Nats-Expected-Last-Subject-Sequence": str(self.sequence),
                "Nats-Expected-Last-Subject-Sequence-Subject": self.subject}


class FenceMoved(Exception):
    """A conditional publish was refused: a newer fact on the fence's subject exists (at `last_sequence`)."""

    def __init__(self, fence: Fence, last_sequence: int) -> None:
        super().__init__(f"{fence.subject} moved past sequence {fence.sequence} (now {last_sequence})")
        self.fence = fence
        self.last_sequence = last_sequence


@dataclass(frozen=True)
class ConsumerPolicy:
    ack_wait_s: float = 30.0
    max_deliver: int = 20
    """The delivery on which a failing handler's fact is given up (its poison handler records it)."""
    max_ack_pending: int = 64
    retry_delays_s: tuple[float, ...] = (0.5, 1.0, 2.0, 5.0, 10.0)
    redeliver_forever: bool = False
    """The server redelivers without limit; `max_deliver` is then only where a failing handler gives up. For facts
    held leased while they wait (a process killed hands every one out again, each delivery counted): the server drops
    a fact at its limit with no handler left to record it, so one that reached it in a crash would stay undone."""
    release_on_stop: bool = False
    """A fact in hand when the service stops is given back at once (nak), not left for its ack wait: for facts held
    leased while they wait (the validator's), which would otherwise all wait `ack_wait_s` after every restart."""


def _last_sequence(description: str | None) -> int:
    """The sequence in JetStream's 'wrong last sequence: N' description (0 when it says none)."""
    found = re.search(r"(\d+)\s*$", description or "")
    return int(found[1]) if found else 0


class JetStream(JetStreamContext):
    """nats-py's JetStream context with its connection public: kv.py's direct reads send their batched gets on it."""

    def __init__(self, nc: Client, prefix: str = JS_API, timeout: float = PUBLISH_TIMEOUT_S) -> None:
        super().__init__(nc, prefix=prefix, timeout=timeout)
        self.nc = nc


class EventBus:
    """One NATS connection per service process."""

    broker: ServiceBroker
    """The faststream broker that opened the connection (`connect`); a service's routers run on it."""

    def __init__(self, nc: Client, name: str = "", replicas: int | None = None) -> None:
        self.nc = nc
        self.tracer = tracer(name.split("-")[0] or "bus")
        """Handler spans are named after the service (`executor-gpu-7` → `sheshnag.executor`)."""
        self.js = JetStream(nc)
        self.replicas = replicas if replicas is not None else ConnectionSettings().nats_replicas
        """Replicas of every stream and bucket this bus makes (`SHESHNAG_NATS_REPLICAS` unless given)."""

    @classmethod
    async def connect(cls, url: str, name: str, *, credentials: Credentials | None = None, attempts: int = -1,
                      replicas: int | None = None, declare: bool = True, stop: asyncio.Event | None = None,
                      on_error: ErrorCallback | None = None, grace_s: float = GRACEFUL_STOP_S) -> Self:
        """The one way to connect: opened by a faststream broker (`bus.broker`: a service includes its routers and
        starts it) as `ServiceBroker.to` says; with `declare`, makes sure the streams exist."""
        broker = ServiceBroker.to(url, name, credentials, attempts, stop, on_error, grace_s)
        bus = cls(await broker.connect(), name, replicas)
        bus.broker = broker
        if declare:
            try:
                await bus.ensure_streams()
            except BaseException:  # refused, broken off or cancelled: the connection goes with the call
                await asyncio.shield(broker.close_within())
                raise
        return bus

    async def close(self) -> None:
        await self.nc.drain()

    async def ensure_streams(self) -> None:
        """EVENTS (kept by limits, direct reads on) and WORK (a work queue)."""
        for name, subject, retention, direct in ((EVENTS_STREAM, EVENTS_SUBJECTS, RetentionPolicy.LIMITS, True),
                                                 (WORK_STREAM, WORK_SUBJECTS, RetentionPolicy.WORK_QUEUE, None)):
            config = StreamConfig(name=name, subjects=[subject], storage=StorageType.FILE, retention=retention,
                                  duplicate_window=DEDUP_WINDOW_S, allow_direct=direct, num_replicas=self.replicas)
            await until_placed(f"stream {name}", functools.partial(self._declare_stream, config))

    async def _declare_stream(self, config: StreamConfig) -> None:
        # Look before declaring: an executor's connection may read stream info but never declare a stream.
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await self.ensure_replicas(await self.js.stream_info(config.name or ""))
            return
        try:
            await self.js.add_stream(config)
        except nats.js.errors.BadRequestError:
            # Another process declared it first, possibly with an older config: keep theirs, at our replicas.
            await self.ensure_replicas(await self.js.stream_info(config.name or ""))

    async def ensure_replicas(self, info: StreamInfo) -> None:
        """Scale a stream (or a bucket's) with fewer replicas than `replicas` up, never down (an operator's choice). A
        broker that refuses leaves it as it is, with a warning: the deployment runs, less durable than configured."""
        have = info.config.num_replicas or 1
        if have >= self.replicas:
            return
        info.config.num_replicas = self.replicas
        try:
            await self.js.update_stream(info.config)
        except (nats.errors.Error, nats.js.errors.Error) as error:
            log.warning("stream %s keeps %d replica(s), not the %d configured: %r",
                        info.config.name, have, self.replicas, error)
        else:
            log.info("stream %s scaled from %d to %d replicas", info.config.name, have, self.replicas)

    async def publish(self, event: Event, fence: Fence | None = None) -> int:
        """Publish a fact once (a retried publish of the same event_id is dropped by the server); with a `fence`,
        only while it holds (else `FenceMoved`, and nothing is written)."""
        headers = {"Nats-Msg-Id": event.event_id, **(fence.headers() if fence else {})}
        try:
            ack = await self.js.publish(event.subject, event.model_dump_json().encode(),
                                        headers=inject_headers(headers), stream=EVENTS_STREAM)
        except nats.js.errors.APIError as error:
            if fence is None or error.err_code != WRONG_LAST_SEQUENCE:
                raise
            raise FenceMoved(fence, _last_sequence(error.description)) from error
        return ack.seq

    async def send(self, command: Command, protocol: int = COMMAND_PROTOCOL) -> None:
        """Send a command once (a retried send is dropped by the server) in the shape of the executor's `protocol`,
        its header naming its batch. Another shape is another message id: a resend after a protocol change is sent."""
        msg_id = command.msg_id if protocol < 2 else f"{command.msg_id}:p{protocol}"
        headers = {"Nats-Msg-Id": msg_id, BATCH_HEADER: command.batch_id}
        await self.js.publish(command.subject, command.wire(protocol), headers=inject_headers(headers),
                              stream=WORK_STREAM)


@contextlib.asynccontextmanager
async def tool_bus(url: str, name: str) -> AsyncIterator[EventBus]:
    """An operator tool's connection for one run (`TOOL_ATTEMPTS` tries to connect), closed however it ends."""
    bus = await EventBus.connect(url, name, attempts=TOOL_ATTEMPTS)
    try:
        yield bus
    finally:
        await bus.close()
