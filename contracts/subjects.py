"""Every stream, subject, KV bucket and durable consumer name; nobody else spells one."""

import re
from typing import Literal, NamedTuple, get_args

AggregateKind = Literal["batch", "file", "executor", "key", "user", "provider", "organization", "account"]
_AGGREGATE_KINDS: dict[str, AggregateKind] = {kind: kind for kind in get_args(AggregateKind)}

EVENTS_STREAM = "EVENTS"
EVENTS_SUBJECTS = "evt.>"
WORK_STREAM = "WORK"
WORK_SUBJECTS = "cmd.>"

READ_MODEL_BUCKET = "sheshnag_read"
EXECUTORS_BUCKET = "sheshnag_executors"
LEADER_BUCKET = "sheshnag_leader"
FLEET_REGISTER = "svc.register.*"
"""Request/reply: executors register with the leading scheduler, each on its own subject (`fleet_registrations`)."""
OBJECT_REQUESTS = "svc.objects.*"
"""Request/reply: executors ask the leading scheduler for presigned URLs of their work's objects."""
FACT_SUBMISSIONS = "svc.facts.*"
"""Request/reply: executors hand the leading scheduler the facts they state (it stores those they may state)."""
LOG_READS = "svc.log.*"
"""Request/reply: executors read the execution facts of the batches they hold from the leading scheduler."""
LEDGER_FOLDED = "svc.ledger.folded"
"""Core publish, no stream: after each group it puts into the read model, the folding ledger says the EVENTS sequence
the read model now holds every fact through (ASCII digits). A gateway reading back its own write waits for it
instead of polling; a notice lost or forged costs only a poll (the read model itself is always what is read)."""
SCHEDULER_LEADER_KEY = "scheduler"
LEDGER_LEADER_KEY = "ledger"

VALIDATOR_DURABLE = "validator"
LEDGER_NAME = "ledger"

KEY_USAGE_BUCKET = "sheshnag_key_usage"
"""When each key was last used (ms), written by gateways at most once a minute per key; not a fact."""
WEBHOOKS_BUCKET = "sheshnag_webhooks"
"""Webhook endpoints (with their signing secrets), every delivery with its attempts, and the deliveries due."""
WEBHOOKS_DURABLE = "webhooks"
"""The gateways' shared durable on the batch facts webhooks are sent for."""
VALIDATIONS_BUCKET = "sheshnag_validations"
"""How often each batch's validation was started (a validator's own count, expiring with the longest window)."""
LIMITS_BUCKET = "sheshnag_limits"
"""Rate-limit and brute-force counts every gateway shares (each entry expires with its window); not a fact."""


def event_subject(kind: AggregateKind, aggregate_id: str, event_name: str) -> str:
    return f"evt.{kind}.{aggregate_id}.{event_name}"


class EventSubject(NamedTuple):
    kind: AggregateKind
    aggregate_id: str
    name: str


def parse_event_subject(subject: str) -> EventSubject | None:
    """`evt.<kind>.<id>.<name>` → its parts; None for any other subject."""
    parts = subject.split(".")
    kind = _AGGREGATE_KINDS.get(parts[1]) if len(parts) == 4 and parts[0] == "evt" else None
    return EventSubject(kind, parts[2], parts[3]) if kind is not None and parts[2] and parts[3] else None


def event_name_of(subject: str) -> str | None:
    """The event name of an event subject (`evt.batch.batch_1.validated` → `validated`); None for any other."""
    fact = parse_event_subject(subject)
    return fact.name if fact is not None else None


def subject_pattern(subject: str) -> str:
    """`evt.batch.batch_1.validated` → `evt.batch.*.validated` (and so for commands): the subject without the id
    it names, so span and metric names stay few."""
    parts = subject.split(".")
    if len(parts) >= 4 and parts[0] in ("evt", "cmd"):
        parts[2] = "*"
    return ".".join(parts)


def batch_events(batch_id: str) -> str:
    """All events of one batch, for SSE and audit."""
    return f"evt.batch.{batch_id}.>"


def attempt_failures(batch_id: str) -> str:
    """Where a batch's `attempt_failed` facts go: the fence every executor's commit is conditional on."""
    return f"evt.batch.{batch_id}.attempt_failed"


def account_facts(account_id: str) -> str:
    """Every fact that moves an account's credit (grants, reservations, releases): the fence a reservation is
    conditional on, so two creates can never both spend the same credit."""
    return f"evt.account.{account_id}.>"


def file_fact(file_id: str, event_name: Literal["used", "deleted", "stored"]) -> str:
    """Where a file's `used` (a batch was created on it) or `deleted` facts go: create and delete fence each other;
    its `stored` fact states its object as the file."""
    return event_subject("file", file_id, event_name)


def batch_fact(batch_id: str, event_name: str) -> str:
    """Where one kind of a batch's facts goes (e.g. its `created` fact, read back to compare a twin create)."""
    return event_subject("batch", batch_id, event_name)


def key_fact(key_aggregate_id: str, event_name: Literal["created", "revoked"]) -> str:
    """Where a key's facts go: under its aggregate id (`contracts.ids.key_aggregate_id`), its random public id; for a
    key made before key ids were random, the first 32 hex digits of its SHA-256."""
    return event_subject("key", key_aggregate_id, event_name)


EXECUTOR_REGISTERED = "evt.executor.*.registered"
"""Every executor's registrations: the auth callout closes connections an id's owner does not admit."""
KEY_CREATED = "evt.key.*.created"
KEY_REVOKED = "evt.key.*.revoked"
SERVER_DISCONNECTS = "$SYS.ACCOUNT.$G.DISCONNECT"
"""nats-server's system account event for each closed connection of the services' (and executors') account."""
SERVER_SHUTDOWNS = "$SYS.SERVER.*.SHUTDOWN"
"""nats-server's system event as a server shuts down (its connections end with it, no DISCONNECT each)."""
SERVER_CONNECTS = "$SYS.ACCOUNT.$G.CONNECT"
"""nats-server's system account event for each connection of that account it has admitted and opened."""


def server_kick(server_id: str) -> str:
    """nats-server's system account service that closes one client connection (`{"cid": …}`) on that server."""
    return f"$SYS.REQ.SERVER.{server_id}.KICK"


FILE_STORED = "evt.file.*.stored"
BATCH_CREATED = "evt.batch.*.created"


def run_command(executor_id: str) -> str:
    return f"cmd.executor.{executor_id}.run"


def finalize_command(executor_id: str) -> str:
    """Where the scheduler sends one executor the finalize commands of the batches it chose it to finalize."""
    return f"cmd.executor.{executor_id}.finalize"


def fleet_registrations(executor_id: str) -> str:
    """Where one executor registers: only a connection admitted as that executor may publish here, so the subject
    says which id registers (the body must name the same one)."""
    return f"svc.register.{executor_id}"


def object_requests(executor_id: str) -> str:
    """Where one executor asks for object URLs: only it may publish here, so the subject says who asks."""
    return f"svc.objects.{executor_id}"


def fact_submissions(executor_id: str) -> str:
    """Where one executor submits facts: only it may publish here, so the subject says who states them."""
    return f"svc.facts.{executor_id}"


def log_reads(executor_id: str) -> str:
    """Where one executor reads batch logs: only it may publish here, so the subject says who reads."""
    return f"svc.log.{executor_id}"


def executor_advert(executor_id: str) -> str:
    """One executor's key in the executors bucket (a KV put is a publish here): written by the executor itself on a
    broker without admissions, else by a scheduler for it (`advert_updates`)."""
    return f"$KV.{EXECUTORS_BUCKET}.{executor_id}"


def advert_updates(executor_id: str) -> str:
    """Where an admitted executor hands a scheduler its advert (or its withdrawal) to write under its key."""
    return f"svc.advert.{executor_id}"


def admission_asks(executor_id: str) -> str:
    """Where an admitted executor asks how long an admission to the broker lasts (to renew its own before it ends)."""
    return f"svc.admission.{executor_id}"


def executor_pulls(executor_id: str) -> str:
    """The JetStream API prefix of an admitted executor's connection: its pulls (`<prefix>.CONSUMER.MSG.NEXT.…`) reach
    a scheduler, which relays each of its own durables to `$JS.API` with the executor's own inbox for reply. JetStream
    answers on whatever reply subject a request names, with the account's rights, so no executor asks it directly."""
    return f"svc.js.{executor_id}"


def executor_acks(executor_id: str) -> str:
    """Where an admitted executor's acks go (the ack subject in `ACK_SUBJECT_HEADER`): a scheduler publishes each of
    its own durables' with no reply (an ack naming one is answered there, with the account's rights)."""
    return f"svc.ack.{executor_id}"


ACK_SUBJECT_HEADER = "Sheshnag-Ack"


BATCH_HEADER = "Sheshnag-Batch-Id"
"""The header every command carries naming its batch (a command's subject names only its executor)."""


JS_API = "$JS.API"
"""JetStream's API prefix (no JetStream domain is used)."""


def direct_get(stream: str) -> str:
    """Where a direct get of `stream` is asked (by sequence, by last subject, or a batch of them)."""
    return f"{JS_API}.DIRECT.GET.{stream}"


def consumer_next(stream: str, consumer: str) -> str:
    """JetStream's API subject that asks a pull consumer for its next messages."""
    return f"{JS_API}.CONSUMER.MSG.NEXT.{stream}.{consumer}"


def executor_durable(executor_id: str) -> str:
    return f"executor-{executor_id}"


def executor_finalize_durable(executor_id: str) -> str:
    """One executor's durable on its `finalize_command` subject. Not `executor-…`: no executor id may name
    another's finalize durable as its own run durable (ids may hold `-`)."""
    return f"finalizer-{executor_id}"


ReadModelKind = Literal["batch", "file", "apikey", "user", "provider", "executor", "anomaly", "organization",
                        "account"]


def read_model_key(kind: ReadModelKind, ident: str) -> str:
    return f"{kind}.{ident}"


def owner_index_key(owner: str, kind: Literal["batch", "file"], ident: str) -> str:
    """Where a record is filed under its owner (a batch: its id and creation time; a file: a copy of its record), so
    the owner's checks and list pages read only their own."""
    return f"owner.{owner}.{kind}.{ident}"


def owner_index(owner: str, kind: Literal["batch", "file"]) -> str:
    """Every entry of `kind` filed under `owner`."""
    return f"owner.{owner}.{kind}.>"


HolderIndex = Literal["keys", "providers", "executors", "members"]
"""Records filed under who holds them, so the holder's lists, limits and revocations read only theirs: API keys under
their user and their provider (`ApiKeyRecord.holders`), providers under their owner, executors under their provider,
users under their organisation."""


def filed_key(index: HolderIndex, holder: str, ident: str) -> str:
    """Where a record (`ident`: a key's SHA-256, a provider's or an executor's id) is filed under `holder`."""
    return f"{index}.{holder}.{ident}"


def filed_under(index: HolderIndex, holder: str) -> str:
    """Every record of `index` filed under `holder`."""
    return f"{index}.{holder}.>"


def key_id_key(key_id: str) -> str:
    """The SHA-256 (the record's key) of the API key with this public id: a key is found by its id in one read."""
    return f"keyid.{key_id}"


HOLDERS_INDEXED_KEY = "indexed.holders"
"""Present once every key, provider and executor record is filed under its holders (a read model made before those
indexes is given them by the ledger once): until then they are found by reading them all."""


def overdrawn_key(account_id: str) -> str:
    """Present while the account's balance is below zero with billed batches open (`AccountRecord.overdrawn`): the
    credit sweep reads these, not every account."""
    return f"overdrawn.{account_id}"


OVERDRAWN = "overdrawn.>"
OVERDRAWN_INDEXED_KEY = "indexed.overdrawn"
"""Present once every overdrawn account is filed (`overdrawn_key`): until then the sweep reads every account."""
MEMBERS_INDEXED_KEY = "indexed.members"
"""Present once every user record is filed under its organisation (`members`): until then an organisation's members
are found by reading every user."""


def owner_live_key(owner: str) -> str:
    """The ids of the owner's batches that have not ended (a JSON list): their live batches, read without their
    history (an owner's index keeps every batch they ever had)."""
    return f"owner.{owner}.live"


def owner_stored_key(owner: str) -> str:
    """The owner's stored bytes, by part of their files (`StoredBytes`)."""
    return f"owner.{owner}.stored"


def owner_stored_part_key(owner: str, part: str) -> str:
    """One part of the owner's files that are not deleted, by the first two hex digits of their SHA-256
    (`StoredFiles`)."""
    return f"owner.{owner}.stored.{part}"


def input_object_key(file_id: str) -> str:
    return f"files/{file_id}"


def results_prefix(batch_id: str) -> str:
    """Where every result chunk of a batch lies."""
    return f"results/{batch_id}/"


def result_chunk_key(batch_id: str, attempt: int, chunk: int) -> str:
    return f"{results_prefix(batch_id)}attempt-{attempt}/chunk-{chunk:06d}.jsonl"


_RESULT_CHUNK_KEY = re.compile(r"results/(?P<batch>[^/]+)/attempt-(?P<attempt>\d+)/chunk-(?P<chunk>\d+)\.jsonl")


def parse_result_chunk_key(key: str) -> tuple[str, int, int] | None:
    """(batch id, attempt, chunk) of a `result_chunk_key`; None for any other key."""
    match = _RESULT_CHUNK_KEY.fullmatch(key)
    return (match["batch"], int(match["attempt"]), int(match["chunk"])) if match else None


def rejections_key(batch_id: str) -> str:
    return f"validation/{batch_id}/rejected.jsonl"
