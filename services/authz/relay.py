"""What an admitted executor asks of JetStream, asked for it by a scheduler: its pulls and acks (relayed), its advert
(written under its key) and how long an admission lasts.

nats-server answers a JetStream request (a pull, an ack, a KV put) and a `$SYS` request on whatever reply subject it
names, with the account's rights: an executor asking JetStream itself could have the answer written on any subject
(the event log's, the leader lease, another executor's commands; nats-server#8274). So an executor may publish only to
subjects answered here, and each is relayed or answered only with the asking executor's own inbox for reply (or with
none): everything JetStream then writes goes to that inbox alone.
"""

import logging
import re
from dataclasses import dataclass
from typing import Annotated, Protocol

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg

from contracts.commands import AdmissionAsk, AdmissionTerms, AdvertReceipt, AdvertUpdate
from contracts.permissions import executor_inbox
from contracts.subjects import (
    ACK_SUBJECT_HEADER,
    WORK_STREAM,
    admission_asks,
    advert_updates,
    consumer_next,
    executor_acks,
    executor_durable,
    executor_finalize_durable,
    executor_pulls,
)
from services.runtime.nats.answers import Answer, RawAnswer
from services.runtime.nats.bus import EventBus
from services.runtime.nats.fleet import MAX_ADVERT_VALUE_BYTES, Fleet
from services.runtime.process.params import Context, Path
from services.runtime.process.skip_log import SkipLog

log = logging.getLogger(__name__)

RELAYS = "sheshnag-relays"
"""Queue group: with several schedulers (leader or standby), one of them relays or answers each request."""
PULLS = RawAnswer(f"{executor_pulls('*')}.CONSUMER.MSG.NEXT.{WORK_STREAM}.*", RELAYS, traced=False)
ACKS = RawAnswer(executor_acks("*"), RELAYS, traced=False)
ADVERTS = Answer(advert_updates("{executor_id}"), AdvertUpdate,
                 lambda why: AdvertReceipt(stored=False, reason=f"Malformed advert: {why}"))
"""Answered by the leader, which says whether it counts the executor registered (`AdvertReceipt.registered`): with
no scheduler at all nobody can take it for lost, and its silence then is no reason to register again."""
ADMISSIONS = Answer(admission_asks("{executor_id}"), AdmissionAsk, lambda why: AdmissionTerms(ttl_s=None),
                    leader_only=False, queue=RELAYS)
ACK_BODY = re.compile(rb'|\+ACK|-NAK(?: \{"delay": ?\d{1,19}\})?|\+WPI|\+TERM')
"""What nats-py sends as an ack, a nak (with its delay), a keep-alive or a termination; nothing else is relayed."""
_NOT_RELAYED = SkipLog(log, "not relayed")
MAX_PULL_BYTES = 1024


class Relaying(Protocol):
    """What the relays need: the scheduler's bus and how long an admission lasts (None: the broker asks nobody who
    connects). The auth callout's `ExecutorAuthority` is one; `BareRelay` is one without it."""

    @property
    def bus(self) -> EventBus: ...

    @property
    def ttl_s(self) -> float | None: ...


@dataclass(frozen=True)
class BareRelay:
    """The relays' dependencies on a broker without admissions (a development broker that asks nobody who connects;
    an executor with a worker key still has its requests relayed)."""

    bus: EventBus
    ttl_s: float | None = None


def own_durables(executor_id: str) -> tuple[str, str]:
    return executor_durable(executor_id), executor_finalize_durable(executor_id)


def _replies_home(executor_id: str, reply: str) -> bool:
    """Whether `reply` (maybe none) goes to the executor's own inbox."""
    return not reply or reply.startswith(f"{executor_inbox(executor_id)}.")


def own_ack_subject(executor_id: str, subject: str) -> bool:
    """Whether `subject` is an ack subject of a message of one of the executor's own durables on WORK (the server's
    `$JS.ACK.<stream>.<consumer>.<deliveries>.<stream seq>.<consumer seq>.<time>.<pending>`)."""
    durables = "|".join(re.escape(durable) for durable in own_durables(executor_id))
    return re.fullmatch(rf"\$JS\.ACK\.{WORK_STREAM}\.(?:{durables})(?:\.\d{{1,20}}){{5}}", subject) is not None


async def relay_pull(relaying: Relaying, message: Msg) -> None:
    """A pull on one of the asker's own durables, to JetStream with the asker's inbox for reply: the messages (or
    the pull's status) go straight to it."""
    tokens = message.subject.split(".")
    executor_id, durable = tokens[2], tokens[-1]
    if durable not in own_durables(executor_id) or not message.reply or not _replies_home(executor_id, message.reply):
        _NOT_RELAYED.skipped(executor_id, f"a pull on {durable[:80]!r} answered on {message.reply[:120]!r}")
        return
    if len(message.data) > MAX_PULL_BYTES:  # nats-py's are a few dozen bytes
        _NOT_RELAYED.skipped(executor_id, f"a pull request of {len(message.data)} bytes")
        return
    await relaying.bus.nc.publish(consumer_next(WORK_STREAM, durable), message.data, reply=message.reply)


async def relay_ack(relaying: Relaying, message: Msg) -> None:
    """An ack (nak, keep-alive, termination) of a message of one of the asker's own durables; an ack asking for
    confirmation (nats-py's `ack_sync`) is confirmed to the asker's inbox."""
    executor_id = message.subject.rsplit(".", 1)[-1]
    acked = (message.headers or {}).get(ACK_SUBJECT_HEADER, "")
    if (not own_ack_subject(executor_id, acked) or ACK_BODY.fullmatch(message.data) is None
            or not _replies_home(executor_id, message.reply)):
        _NOT_RELAYED.skipped(executor_id, f"an ack of {acked[:120]!r} answered on {message.reply[:120]!r}")
        return
    await relaying.bus.nc.publish(acked, message.data, reply=message.reply)


async def write_advert(update: AdvertUpdate, executor_id: str, fleet: Fleet, registered: bool | None) -> AdvertReceipt:
    """The asker's advert under its own key (whatever id the body names), or its key deleted."""
    advert = update.advert
    value = b"" if advert is None else advert.model_copy(update={"executor_id": executor_id}).model_dump_json().encode()
    if len(value) > MAX_ADVERT_VALUE_BYTES:
        return AdvertReceipt(stored=False, reason=f"An advert may be at most {MAX_ADVERT_VALUE_BYTES} bytes.")
    try:
        if advert is None:
            await fleet.kv.delete(executor_id)
        else:
            await fleet.kv.put(executor_id, value)
    except (nats.errors.TimeoutError, nats.js.errors.Error) as error:
        log.warning("advert of %s not stored: %r", executor_id, error)
        return AdvertReceipt(stored=False, reason="The executors bucket did not take the advert; try again.")
    return AdvertReceipt(stored=True, registered=registered)


async def admission_terms(request: AdmissionAsk, executor_id: Annotated[str, Path()],
                          authority: Annotated[Relaying, Context()]) -> AdmissionTerms:
    return AdmissionTerms(ttl_s=authority.ttl_s)
