"""The public payload of one `GET /v1/batches/{id}/events` frame: what a client may rely on, nothing internal.

Each SSE frame is `id: <stream sequence>`, `event: <type>`, `data: <BatchStreamEvent as JSON>`. A frame carries
`type`, `batch_id` and `occurred_at`, plus exactly the fields `EVENT_FIELDS` lists for its type (a field may be
null, e.g. `line` of a file-level error). Owner key ids, object keys, allowed models and lease tokens never appear.
"""

from typing import Literal

from pydantic import BaseModel, ConfigDict

from contracts.api.batch import BatchUsage, Endpoint
from contracts.events.executor import EngineName

BatchEventType = Literal[
    "batch.created",
    "batch.line_rejected",
    "batch.validation_progressed",
    "batch.validated",
    "batch.validation_failed",
    "batch.waiting",
    "batch.released",
    "batch.assigned",
    "batch.started",
    "batch.progressed",
    "batch.shard_finished",
    "batch.attempt_failed",
    "batch.finalizing",
    "batch.cancel_requested",
    "batch.completed",
    "batch.failed",
    "batch.cancelled",
    "batch.expired",
]
"""The stream ends after the batch's ending fact (`contracts.lifecycle.ENDING_FACTS`)."""

_ENDED = ("output_file_id", "error_file_id", "completed", "failed", "usage")

EVENT_FIELDS: dict[BatchEventType, tuple[str, ...]] = {
    "batch.created": ("input_file_id", "endpoint", "completion_window", "metadata", "created_at", "expires_at",
                      "allow_partial", "hold"),
    "batch.line_rejected": ("line", "code", "param", "message", "custom_id"),
    "batch.validation_progressed": ("lines_read", "errors_found"),
    "batch.validated": ("total_lines", "model", "rejected_lines", "error_count", "counts_by_code"),
    "batch.validation_failed": ("total_lines", "error_count", "counts_by_code", "rejected_lines", "reason",
                                "error_file_id"),
    "batch.waiting": ("reason",),
    "batch.released": (),
    "batch.assigned": ("executor_id", "attempt", "shard", "shards"),
    "batch.started": ("executor_id", "attempt", "engine", "engine_version"),
    "batch.progressed": ("attempt", "shard", "chunk", "completed", "failed", "usage"),
    "batch.shard_finished": ("executor_id", "attempt", "shard", "stopped"),
    "batch.attempt_failed": ("executor_id", "attempt", "code", "reason"),
    "batch.finalizing": (),
    "batch.cancel_requested": ("code",),
    "batch.completed": _ENDED,
    "batch.failed": ("code", "reason"),
    "batch.cancelled": _ENDED,
    "batch.expired": _ENDED,
}
"""The payload fields each event type carries, besides `type`, `batch_id` and `occurred_at`."""


class BatchStreamEvent(BaseModel):
    """One fact of a batch as the event stream shows it; serialise with `exclude_unset` (see `EVENT_FIELDS`)."""

    model_config = ConfigDict(frozen=True)

    type: BatchEventType
    batch_id: str
    occurred_at: int
    """Milliseconds since the epoch."""

    input_file_id: str | None = None
    endpoint: Endpoint | None = None
    completion_window: str | None = None
    metadata: dict[str, str] | None = None
    created_at: int | None = None
    """Seconds since the epoch (`batch.created`)."""
    expires_at: int | None = None
    """When the completion window ends, seconds since the epoch (`batch.created`)."""
    allow_partial: bool | None = None
    hold: bool | None = None

    line: int | None = None
    """1-based input line of a rejected line; null for an error about the whole file."""
    custom_id: str | None = None
    """The rejected line's custom_id, when it had a usable one."""
    code: str | None = None
    """An error code: of a rejected line, a failed attempt, a failed batch, or the code unrun lines get on cancel."""
    param: str | None = None
    """The field of a rejected line at fault."""
    message: str | None = None
    """How to fix a rejected line."""

    lines_read: int | None = None
    errors_found: int | None = None
    total_lines: int | None = None
    model: str | None = None
    """The catalogue id every line resolved to (`batch.validated`)."""
    rejected_lines: int | None = None
    """Input lines validation refused (a line with several errors is one). With allow_partial they go to the error
    file and never run; a batch that failed validation lists them in its error file with every other line."""
    error_count: int | None = None
    """Every error validation found, published or only counted (a line may have several)."""
    counts_by_code: dict[str, int] | None = None
    """How many errors of each code, all of them counted."""

    reason: str | None = None
    """Why a batch waits, an attempt failed or the batch failed (at run time or validation), for a person."""
    executor_id: str | None = None
    """The executor that runs the attempt."""
    attempt: int | None = None
    """Counts up over the batch each time a shard is (re)assigned."""
    shard: int | None = None
    """0-based shard of the input lines the attempt runs."""
    shards: int | None = None
    """How many shards the batch runs as (1: the whole file at once)."""
    engine: EngineName | None = None
    engine_version: str | None = None
    chunk: int | None = None
    """Number of the result chunk just made durable."""
    completed: int | None = None
    """Lines that succeeded: so far in the shard (`batch.progressed`) or in the end (ending events)."""
    failed: int | None = None
    """Lines that failed, counted like `completed`."""
    stopped: bool | None = None
    """The shard stopped on cancel or expiry instead of running every line."""
    output_file_id: str | None = None
    error_file_id: str | None = None
    """The error file of an ended batch; of one that failed validation, every input line with why it did not run."""
    usage: BatchUsage | None = None
    """Tokens: of the chunk just made durable (`batch.progressed`, from executors that state it), or of the whole
    batch (ending events)."""
