"""Every stream, subject, KV bucket and durable consumer name; nobody else spells one."""

from typing import Literal

AggregateKind = Literal["batch", "file", "executor", "key", "user"]

EVENTS_STREAM = "EVENTS"
EVENTS_SUBJECTS = "evt.>"
WORK_STREAM = "WORK"
WORK_SUBJECTS = "cmd.>"

READ_MODEL_BUCKET = "sheshnag_read"
EXECUTORS_BUCKET = "sheshnag_executors"
LEADER_BUCKET = "sheshnag_leader"
FLEET_REGISTER = "svc.fleet.register"
"""Request/reply: executors register with the leading scheduler."""
SCHEDULER_LEADER_KEY = "scheduler"

VALIDATOR_DURABLE = "validator"
SCHEDULER_DURABLE = "scheduler"
LEDGER_NAME = "ledger"

OBJECT_BUCKET = "sheshnag"
KEY_USAGE_BUCKET = "sheshnag_key_usage"
"""When each key was last used (ms), written by gateways at most once a minute per key; not a fact."""


def event_subject(kind: AggregateKind, aggregate_id: str, event_name: str) -> str:
    return f"evt.{kind}.{aggregate_id}.{event_name}"


def batch_events(batch_id: str) -> str:
    """All events of one batch, for SSE and audit."""
    return f"evt.batch.{batch_id}.>"


BATCH_CREATED = "evt.batch.*.created"
BATCH_VALIDATED = "evt.batch.*.validated"
BATCH_ENDED = "evt.batch.*.completed"


def run_command(executor_id: str) -> str:
    return f"cmd.executor.{executor_id}.run"


FINALIZE_COMMAND = "cmd.finalize"
FINALIZERS_DURABLE = "finalizers"


def executor_durable(executor_id: str) -> str:
    return f"executor-{executor_id}"


def read_model_key(kind: Literal["batch", "file", "apikey", "user"], ident: str) -> str:
    return f"{kind}.{ident}"


API_KEYS_IN_READ_MODEL = "apikey.>"


def input_object_key(file_id: str) -> str:
    return f"files/{file_id}"


def result_chunk_key(batch_id: str, attempt: int, chunk: int) -> str:
    return f"results/{batch_id}/attempt-{attempt}/chunk-{chunk:06d}.jsonl"


def rejections_key(batch_id: str) -> str:
    return f"validation/{batch_id}/rejected.jsonl"
