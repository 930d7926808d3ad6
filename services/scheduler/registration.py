"""Admitting executors with a live worker key, on their own subject (only a connection admitted as that id publishes
there). An id is its first registrant's (`ExecutorOwner`); a key serves one live executor at a time; stated times are
clamped to the scheduler's clock. Judged one at a time on the leader's caught-up book, so no registration comes
between a check and the fact it admits."""

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import nats.errors
import nats.js.errors
from nats.js.api import AckPolicy

from contracts.commands import ExecutorRegistration, RegistrationAnswer
from contracts.events.executor import ExecutorRegistered
from contracts.ids import hash_api_key
from contracts.readmodel import ApiKeyRecord
from contracts.subjects import FLEET_REGISTER, WORK_STREAM
from services.executor.durables import executor_durables
from services.runtime.nats.bus import EventBus, Fence, FenceMoved
from services.runtime.nats.delivery import Answer
from services.runtime.nats.facts import last_fact
from services.runtime.nats.readmodel import ReadModel
from services.runtime.process.skip_log import SkipLog
from services.scheduler.book import NEW_EXECUTOR_IDS_PER_WINDOW, NEW_EXECUTOR_IDS_WINDOW_MS, Book, ExecutorOwner
from services.scheduler.domain import HEARTBEAT_FRESH_MS

log = logging.getLogger(__name__)

REGISTRATIONS = Answer(FLEET_REGISTER.replace("*", "{connected_as}"), ExecutorRegistration,
                       lambda why: RegistrationAnswer(accepted=False, reason=f"Malformed registration: {why}"))
"""The subject's parameter is the id the connection was admitted as (not `executor_id`: that is the body's claim)."""
REGISTRATION_INTERVAL_MS = 2000
"""An executor id registers at most once in this long: each registration is a fact of up to its advert's size in the
log kept for good, so a connection registering in a loop is told to retry, not stored each time (an executor
registers once per start, and retries every second)."""
REGISTRATIONS_PER_HOUR = 120
"""Registrations of one id stored in any hour: an executor registers once per start (and after a silence); one
killed every 30 s for an hour still rejoins at once, a connection re-registering every 2 s to grow the log is told to
retry until one is free."""
MAX_ADVERT_BYTES = 32 * 1024
"""The largest advert a registration stores (a real one is about a kilobyte, a hundred models some 10 KB; the
contract's bounds alone allow 150 KB a fact)."""
HOUR_MS = 3_600_000


def worker_key_refusal(record: ApiKeyRecord | None) -> str | None:
    """Why a key may not join the fleet (also asked when the broker admits an executor's connection); None: it may."""
    if record is None:
        return "Unknown worker key."
    if record.revoked:
        return f"Worker key {record.key_id} was revoked."
    if record.role != "worker":
        return f"A {record.role} key cannot register an executor; ask an operator for a worker key."
    return None


def identity_refusal(book: Book, executor_id: str, record: ApiKeyRecord, now_ms: int) -> str | None:
    """Why this worker key may not act as `executor_id` now; None when it may."""
    owner = book.owners.get(executor_id)
    if owner is not None and not owner.admits(record.provider_id, record.key_id):
        return f"Executor id {executor_id} belongs to another provider; choose another id."
    if owner is None:
        if book.new_ids_of(ExecutorOwner(record.provider_id, record.key_id).label, now_ms) \
                >= NEW_EXECUTOR_IDS_PER_WINDOW:
            whose = f"Provider {record.provider_id}" if record.provider_id else f"Worker key {record.key_id}"
            return (f"{whose} brought {NEW_EXECUTOR_IDS_PER_WINDOW} new executor ids in the last "
                    f"{NEW_EXECUTOR_IDS_WINDOW_MS // 3_600_000} h (each is kept for good); start this executor under "
                    "an id it had before (SHESHNAG_EXECUTOR_EXECUTOR_ID).")
    holder = book.key_holders.get(record.key_id)
    if holder is not None and holder != executor_id and holder not in book.lost \
            and now_ms - book.known_executors.get(holder, 0) < HEARTBEAT_FRESH_MS:
        return (f"Worker key {record.key_id} serves executor {holder}, which is live; each executor needs a worker "
                "key of its own.")
    return None


@dataclass
class Registrar:
    bus: EventBus
    read_model: ReadModel
    book: Book
    caught_up: asyncio.Event
    """Set once the book has read the whole log."""
    one_at_a_time: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held while a registration is judged and stated (the durable sweep holds it too)."""
    _recent: dict[str, deque[int]] = field(default_factory=dict)
    """Executor id → when its registrations of the last hour were accepted (as this leader saw them)."""
    refusals: SkipLog = field(default_factory=lambda: SkipLog(log, "refused"))
    clock: Callable[[], float] = time.time
    """Seconds since the epoch: the scheduler's clock, which registrations are judged and stamped by."""

    async def answer(self, executor_id: str, request: ExecutorRegistration) -> RegistrationAnswer:
        """Judge a registration that arrived on `executor_id`'s own subject."""
        if request.executor_id != executor_id or request.advert.executor_id != executor_id:
            return RegistrationAnswer(accepted=False, reason=(
                f"A connection admitted as executor {executor_id} registers only that id."))
        if len(request.advert.model_dump_json()) > MAX_ADVERT_BYTES:
            return RegistrationAnswer(accepted=False, reason=(
                f"The advert is larger than {MAX_ADVERT_BYTES} bytes: advertise the catalogue models this executor "
                "serves, not more."))
        if not self.caught_up.is_set():
            return RegistrationAnswer(accepted=False, retry=True, reason="The scheduler is still reading the log.")
        record = await self.read_model.get_api_key(hash_api_key(request.worker_key))
        refusal = worker_key_refusal(record)
        if refusal is not None or record is None:
            return RegistrationAnswer(accepted=False, reason=refusal)
        async with self.one_at_a_time:
            now_ms = int(self.clock() * 1000)
            if now_ms - self.book.incarnations.get(executor_id, 0) < REGISTRATION_INTERVAL_MS:
                return RegistrationAnswer(accepted=False, retry=True, reason=(
                    f"Executor {executor_id} registered less than {REGISTRATION_INTERVAL_MS // 1000} s ago."))
            recent = self._recent_of(executor_id, now_ms)
            if len(recent) >= REGISTRATIONS_PER_HOUR:
                return RegistrationAnswer(accepted=False, retry=True, reason=(
                    f"Executor {executor_id} registered {len(recent)} times in the last hour; it may again in "
                    f"{(recent[0] + HOUR_MS - now_ms) // 1000 + 1} s."))
            refusal = identity_refusal(self.book, executor_id, record, now_ms)
            if refusal is not None:
                self.refusals.skipped(f"executor {executor_id}", f"its registration with worker key "
                                                                 f"{record.key_id}: {refusal}")
                return RegistrationAnswer(accepted=False, reason=refusal)
            try:
                await provide_durables(self.bus, executor_id, request)
            except (nats.errors.Error, TimeoutError) as error:
                return RegistrationAnswer(accepted=False, retry=True, reason=(
                    f"The durables of executor {executor_id} could not be made yet ({error!r})."))
            advert = request.advert.model_copy(update={"heartbeat_at": min(request.advert.heartbeat_at, now_ms)})
            registered = ExecutorRegistered(aggregate_id=executor_id, advert=advert, started_at=now_ms,
                                            worker_key_id=record.key_id, provider_id=record.provider_id)
            # Conditional on the id's registrations as judged: a second leader for a moment (a lease handover)
            # cannot admit another provider under it at the same time.
            last = await last_fact(self.bus, registered.subject)
            try:
                await self.bus.publish(registered, Fence(registered.subject, last[0] if last else 0))
            except FenceMoved:
                return RegistrationAnswer(accepted=False, retry=True,
                                          reason=f"Another registration of executor {executor_id} came first.")
            self.book.apply(registered)
            recent.append(now_ms)
        log.info("executor %s registered with worker key %s", executor_id, record.key_id)
        return RegistrationAnswer(accepted=True, worker_key_id=record.key_id)

    def _recent_of(self, executor_id: str, now_ms: int) -> deque[int]:
        """The id's registrations of the last hour; ids with none are forgotten (every id's, once an hour goes by)."""
        for other in [other for other, times in self._recent.items() if not times or times[-1] <= now_ms - HOUR_MS]:
            del self._recent[other]
        recent = self._recent.setdefault(executor_id, deque())
        while recent and recent[0] <= now_ms - HOUR_MS:
            recent.popleft()
        return recent


async def provide_durables(bus: EventBus, executor_id: str, request: ExecutorRegistration) -> None:
    """Make (or bring to this registration's policy, in place) the executor's two durables on WORK: the only ones it
    may pull from, and none it may make itself. One made otherwise (a push consumer, another filter: made by whoever
    could connect under the id before it was registered, or an older version) is replaced; its commands stay in the
    stream for the new one. A pull durable of the right filter that the server would not update is kept as it is: it
    may be the live executor's (a rejoin), whose commands in hand a new durable would deliver again at once."""
    for durable in executor_durables(executor_id, request.ack_wait_s, request.max_deliver,
                                     request.advert.parallel_attempts):
        config = durable.consumer_config()
        try:
            await bus.js.add_consumer(WORK_STREAM, config)
        except (nats.js.errors.BadRequestError, nats.js.errors.ServerError) as error:  # 10012: push, not pull
            if not await _made_otherwise(bus, durable.name, durable.subject):
                log.warning("durable %s of executor %s kept with its own policy (%s)", durable.name, executor_id,
                            error)
                continue
            log.warning("durable %s of executor %s was made otherwise (%s): made again", durable.name, executor_id,
                        error)
            with contextlib.suppress(nats.js.errors.NotFoundError):
                await bus.js.delete_consumer(WORK_STREAM, durable.name)
            await bus.js.add_consumer(WORK_STREAM, config)


async def _made_otherwise(bus: EventBus, name: str, subject: str) -> bool:
    """Whether the durable is one its executor could not pull its commands from (push, another filter), or gone."""
    try:
        info = await bus.js.consumer_info(WORK_STREAM, name)
    except nats.js.errors.NotFoundError:
        return True
    config = info.config
    return bool(config.deliver_subject) or config.filter_subject != subject or bool(config.filter_subjects) \
        or config.ack_policy != AckPolicy.EXPLICIT
