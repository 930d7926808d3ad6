"""What an executor's NATS credentials may touch: the subjects its connection may publish to and subscribe on.

The auth callout grants exactly this set to a connection that proved a live worker key. Everything not listed
is refused by the server: other executors' commands, durables and heartbeats, key and user facts, the read
model, stream and consumer administration. Extend it here when the executor needs one more subject.
"""

from dataclasses import dataclass

from contracts.subjects import (
    EVENTS_STREAM,
    EXECUTORS_BUCKET,
    FINALIZE_COMMAND,
    FINALIZERS_DURABLE,
    FLEET_REGISTER,
    WORK_STREAM,
    executor_durable,
    object_requests,
    run_command,
)

EXECUTOR_ID_PATTERN = r"[A-Za-z0-9_-]{1,64}"
"""An executor id is one subject token and a valid consumer name."""

EXECUTOR_READERS = 16
"""Consumers on EVENTS one executor may hold at once (one per batch log it reads)."""

EXECUTOR_BATCH_FACTS = ("started", "progressed", "shard_finished", "finalizing", "attempt_failed",
                        "completed", "cancelled", "expired", "failed")
"""The batch facts executors publish (`evt.batch.<id>.<name>`); the rest belong to other services. `failed`: the
finalizer of a batch failed at run time, or of one whose files cannot be assembled, names its end."""

EXECUTOR_FILE_FACTS = ("stored",)
"""Output and error files an executor assembles."""

API = "$JS.API"
AUTH_CALLOUT_SUBJECT = "$SYS.REQ.USER.AUTH"
"""nats-server asks here who a connecting client is (every client but the core user); one answer each."""
USER_INFO_SUBJECT = "$SYS.REQ.USER.INFO"
"""nats-server answers here, to the asking connection alone, who it is and how long its admission has left."""


@dataclass(frozen=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]


def executor_inbox(executor_id: str) -> str:
    """The inbox prefix of an executor's connection: the only subjects it may subscribe to."""
    return f"_INBOX_EXECUTOR.{executor_id}"


def executor_reader(executor_id: str, slot: int) -> str:
    """The name of one of the executor's consumers on EVENTS (it reads batch logs through these only)."""
    return f"executor-{executor_id}-read-{slot}"


def executor_readers(executor_id: str) -> list[str]:
    return [executor_reader(executor_id, slot) for slot in range(EXECUTOR_READERS)]


def _work_consumer(durable: str, filter_subject: str) -> list[str]:
    """Create (the filter is part of the API subject, so it cannot be widened), pull from and ack one durable."""
    return [f"{API}.CONSUMER.CREATE.{WORK_STREAM}.{durable}.{filter_subject}",
            f"{API}.CONSUMER.MSG.NEXT.{WORK_STREAM}.{durable}",
            f"$JS.ACK.{WORK_STREAM}.{durable}.>"]


def _event_reader(name: str) -> list[str]:
    """A consumer on EVENTS under a name of the executor's own, whose filter can only be batch facts."""
    return [f"{API}.CONSUMER.CREATE.{EVENTS_STREAM}.{name}.evt.batch.>",
            f"{API}.CONSUMER.MSG.NEXT.{EVENTS_STREAM}.{name}",
            f"{API}.CONSUMER.DELETE.{EVENTS_STREAM}.{name}"]


def executor_permissions(executor_id: str) -> Permissions:
    publish = [
        FLEET_REGISTER,
        object_requests(executor_id),
        f"$KV.{EXECUTORS_BUCKET}.{executor_id}",
        f"{API}.STREAM.INFO.KV_{EXECUTORS_BUCKET}",
        f"{API}.STREAM.INFO.{EVENTS_STREAM}",
        f"{API}.STREAM.INFO.{WORK_STREAM}",
        *_work_consumer(executor_durable(executor_id), run_command(executor_id)),
        *_work_consumer(FINALIZERS_DURABLE, FINALIZE_COMMAND),
        *(subject for name in executor_readers(executor_id) for subject in _event_reader(name)),
        *(f"evt.batch.*.{fact}" for fact in EXECUTOR_BATCH_FACTS),
        *(f"evt.file.*.{fact}" for fact in EXECUTOR_FILE_FACTS),
        f"evt.executor.{executor_id}.>",
        USER_INFO_SUBJECT,  # when its admission expires, to renew it before it does
    ]
    return Permissions(publish=tuple(publish), subscribe=(f"{executor_inbox(executor_id)}.>",))
