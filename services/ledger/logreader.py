"""Reading the EVENTS log back for operators: an ordered consumer from a sequence or a time, to the head."""

import logging
from collections.abc import AsyncIterator
from datetime import datetime

import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy

from contracts.subjects import EVENTS_STREAM, EVENTS_SUBJECTS
from services.ledger.chain import Fact
from services.runtime.bus import EventBus

log = logging.getLogger(__name__)

QUIET_S = 2.0
"""With nothing delivered for this long, nothing matches (only an empty filter is ever this quiet)."""


async def read_log(bus: EventBus, subject: str = EVENTS_SUBJECTS, start_sequence: int = 1,
                   start_time: datetime | None = None) -> AsyncIterator[Msg]:
    """Every message on `subject` from the start given, in stream order, up to the head when reading began."""
    head = (await bus.js.stream_info(EVENTS_STREAM)).state.last_seq
    if head < start_sequence:
        return
    if start_time is None:
        config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start_sequence)
    else:
        config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_TIME, opt_start_time=start_time)
    subscription = await bus.js.subscribe(subject, stream=EVENTS_STREAM, ordered_consumer=True, config=config,
                                          pending_msgs_limit=1_000_000, pending_bytes_limit=1 << 30)
    try:
        while True:
            try:
                message = await subscription.next_msg(timeout=QUIET_S)
            except nats.errors.TimeoutError:
                if await _nothing_pending(subscription):
                    return
                continue  # a loaded server or client may pause longer than QUIET_S: keep reading
            metadata = message.metadata
            if metadata.sequence.stream > head:
                return
            yield message
            if metadata.sequence.stream >= head or metadata.num_pending == 0:
                return
    finally:
        await subscription.unsubscribe()


async def _nothing_pending(subscription: JetStreamContext.PushSubscription) -> bool:
    """Whether the consumer has delivered everything it matched (a quiet spell is not proof of it)."""
    try:
        info = await subscription.consumer_info()
    except nats.errors.Error as error:
        log.warning("cannot tell whether the log read is complete (%r); ending it", error)
        return True
    return not info.num_pending and not info.num_ack_pending


def fact_of(message: Msg) -> Fact:
    return Fact(message.metadata.sequence.stream, message.subject, message.data)
