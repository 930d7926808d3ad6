"""What an executor's NATS credentials may touch: the subjects its connection may publish to and subscribe on.

The auth callout grants exactly this set to a connection that proved a live worker key. Everything not listed
is refused by the server: the event log itself (an executor neither reads nor writes EVENTS: the leading
scheduler's fact desk does both for it, for the batches it holds), other executors' commands, durables and
heartbeats, the read model, stream and consumer administration, and every read that lists or describes a stream,
bucket or consumer (a stream's info filtered by subject names every id on it: tenants', keys', executors'). Extend
it here when the executor needs one more subject.
"""

from dataclasses import dataclass

from contracts.fact_desk import FACTS_PER_SUBMISSION, MAX_STATED_FACT_CHARS
from contracts.subjects import (
    JS_API,
    WORK_STREAM,
    consumer_next,
    executor_advert,
    executor_durable,
    executor_finalize_durable,
    fact_submissions,
    finalize_command,
    fleet_registrations,
    log_reads,
    object_requests,
    run_command,
)

EXECUTOR_ID_PATTERN = r"[A-Za-z0-9_-]{1,64}"
"""An executor id is one subject token and a valid consumer name."""

API = JS_API
AUTH_CALLOUT_SUBJECT = "$SYS.REQ.USER.AUTH"
"""nats-server asks here who a connecting client is (every client but the core user); one answer each."""
USER_INFO_SUBJECT = "$SYS.REQ.USER.INFO"
"""nats-server answers here, to the asking connection alone, who it is and how long its admission has left."""


EXECUTOR_MAX_PAYLOAD = FACTS_PER_SUBMISSION * MAX_STATED_FACT_CHARS * 4 + 16 * 1024
"""The largest message an executor's connection may publish (the server closes one that sends more): its largest is a
fact submission, each fact's characters at most 4 bytes of UTF-8, with room for the envelope; registrations and
adverts are bounded far below. Not the server's 1 MiB: every request is parsed whole, one at a time, on the leader."""


@dataclass(frozen=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]


def executor_inbox(executor_id: str) -> str:
    """The inbox prefix of an executor's connection: the only subjects it may subscribe to."""
    return f"_INBOX_EXECUTOR.{executor_id}"


def asker_inbox(request_subject: str) -> str:
    """The prefix every reply to an executor's request must have: the inbox of the executor its subject names
    (`svc.facts.<id>` → `_INBOX_EXECUTOR.<id>.`). Its requests may name any reply subject; answered only here."""
    return f"{executor_inbox(request_subject.rsplit('.', 1)[-1])}."


def _work_consumer(durable: str, filter_subject: str, registered: bool) -> list[str]:
    """Pull from and ack one durable. Its scheduler makes it when it accepts the registration (made by executors,
    durables could be made under ids never registered, or shaped to lock their owner out); only an id already
    registered may also make its own, pinned to its filter (an executor of an older version does so at each start)."""
    make = [f"{API}.CONSUMER.CREATE.{WORK_STREAM}.{durable}.{filter_subject}"] if registered else []
    return [*make, consumer_next(WORK_STREAM, durable), f"$JS.ACK.{WORK_STREAM}.{durable}.>"]


def executor_permissions(executor_id: str, registered: bool = False) -> Permissions:
    """What a connection admitted as `executor_id` may do; `registered`: the id has a registered owner (this one)."""
    publish = [
        fleet_registrations(executor_id),  # its registration, under its own id alone
        object_requests(executor_id),
        executor_advert(executor_id),  # its heartbeat, a plain publish: no look at the bucket's stream
        *_work_consumer(executor_durable(executor_id), run_command(executor_id), registered),
        *_work_consumer(executor_finalize_durable(executor_id), finalize_command(executor_id), registered),
        fact_submissions(executor_id),  # its batch and file facts, judged and stored by the fact desk
        log_reads(executor_id),  # the execution facts of the batches it holds
        USER_INFO_SUBJECT,  # when its admission expires, to renew it before it does
    ]
    return Permissions(publish=tuple(publish), subscribe=(f"{executor_inbox(executor_id)}.>",))
