"""What an executor's NATS credentials may touch: the subjects its connection may publish to and subscribe on.

The auth callout grants exactly this set to a connection that proved a live worker key. Every subject in it is
answered by a scheduler, which answers (or relays to JetStream) only with the asking executor's own inbox for reply:
nats-server answers a JetStream request (a pull, an ack, a KV put) or a `$SYS` request on whatever reply subject it
names, with the account's rights (nats-server#8274), so no executor may ask the server anything itself
(`services/authz/relay.py`). Everything not listed is refused by the server: the event log itself (an executor neither
reads nor writes EVENTS: the leading scheduler's fact desk does both for it, for the batches it holds), other
executors' commands, durables and adverts, the read model, stream and consumer administration, and every read that
lists or describes a stream, bucket or consumer. Extend it here when the executor needs one more subject, answered
the same way.
"""

from dataclasses import dataclass

from contracts.fact_desk import FACTS_PER_SUBMISSION, MAX_STATED_FACT_CHARS
from contracts.subjects import (
    WORK_STREAM,
    admission_asks,
    advert_updates,
    executor_acks,
    executor_durable,
    executor_finalize_durable,
    executor_pulls,
    fact_submissions,
    fleet_registrations,
    log_reads,
    object_requests,
)

EXECUTOR_ID_PATTERN = r"[A-Za-z0-9_-]{1,64}"
"""An executor id is one subject token and a valid consumer name."""

AUTH_CALLOUT_SUBJECT = "$SYS.REQ.USER.AUTH"
"""nats-server asks here who a connecting client is (every client but the core user); one answer each."""


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


def executor_permissions(executor_id: str) -> Permissions:
    """What a connection admitted as `executor_id` may do."""
    pulls = executor_pulls(executor_id)
    publish = [
        fleet_registrations(executor_id),  # its registration, under its own id alone
        object_requests(executor_id),
        advert_updates(executor_id),  # its heartbeat, written under its own key by a scheduler
        *(f"{pulls}.CONSUMER.MSG.NEXT.{WORK_STREAM}.{durable}"  # its two durables' pulls, relayed
          for durable in (executor_durable(executor_id), executor_finalize_durable(executor_id))),
        executor_acks(executor_id),  # their acks, relayed
        fact_submissions(executor_id),  # its batch and file facts, judged and stored by the fact desk
        log_reads(executor_id),  # the execution facts of the batches it holds
        admission_asks(executor_id),  # how long its admission lasts, to renew it before it expires
    ]
    return Permissions(publish=tuple(publish), subscribe=(f"{executor_inbox(executor_id)}.>",))
