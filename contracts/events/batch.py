"""Facts in a batch's life, from creation through validation and execution to its end."""

from typing import Annotated, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from contracts.api.batch import BatchUsage, Placement
from contracts.events.envelope import Event
from contracts.events.executor import EngineName
from contracts.terms import WithTerms

CancelCode = Literal["batch_cancelled", "authorization_revoked", "insufficient_credits"]
AdminCancelCode = Literal["cancelled_by_org_admin", "cancelled_by_platform_admin"]
"""The `errors.data` entry of a batch cancelled by an administrator of its owner's organisation, or of the platform."""
FailureCode = Literal["validation_error", "model_unavailable", "enqueued_request_limit_exceeded",
                      "attempts_exhausted", "finalize_failed", "batch_failed"]
"""Why Sheshnag's services fail a batch (`batch.failed`'s `code`)."""


class ShardLayout(BaseModel):
    """How a batch's input lines are split into shards that executors run in parallel."""

    model_config = ConfigDict(frozen=True)

    shards: int = 1
    span: int = 0

    def first_line(self, shard: int) -> int:
        return 1 if self.shards == 1 else shard * self.span + 1

    def last_line(self, shard: int) -> int | None:
        """The shard's last input line; None: to the end of the file."""
        return None if shard >= self.shards - 1 else (shard + 1) * self.span

    def shard_of(self, line: int) -> int:
        return 0 if self.shards == 1 else min((line - 1) // self.span, self.shards - 1)

    @classmethod
    def split(cls, total_lines: int, shards: int) -> "ShardLayout":
        if shards <= 1 or total_lines <= 1:
            return cls()
        span = -(-total_lines // shards)
        return cls(shards=-(-total_lines // span), span=span)


class BatchEvent(Event):
    kind: ClassVar = "batch"
    correlated_by: ClassVar = "aggregate_id"


class BatchCreated(WithTerms, BatchEvent):
    """A batch's terms, said once; version 1 stated each term as a field of its own (lifted into `terms`)."""

    name: ClassVar = "created"
    type: Literal["batch.created"] = "batch.created"
    version: int = 2
    input_file_id: str
    completion_window: str
    metadata: dict[str, str] | None = None
    allow_partial: bool = False
    """Run the valid lines and put refused ones in the error file, instead of failing the whole batch."""
    hold: bool = False
    """Validate only: once validated the batch waits for `batch.released` before anything runs."""
    allowed_models: list[str] | None = None
    """Catalogue ids the owner may use, from their key when the batch was created; None: every model."""
    owner_user_id: str | None = None
    """The user of the creating key (None: a key without a user owns it alone): whose share of the fleet it uses."""
    organization_id: str | None = None
    """The user's organisation when the batch was created (None: none): the outer level of fair share."""
    default_model: str | None = None
    """The model of lines that name none, as the creator gave it: `metadata.model`, else the model named when the
    input file was uploaded. None: each line names its own, or takes the first one an earlier line named."""
    billing_account: str | None = None
    """With billing on: the account (the owner's organisation) whose `account.reserved` fact holds this batch's
    worst-case price; its usage is debited there as result chunks commit. None: the batch is not billed."""
    placement: Placement = "approved_providers"
    """Which executors may run it (`contracts.api.batch.Placement`); facts from before placement: approved ones."""

    @model_validator(mode="after")
    def _expires(self) -> "BatchCreated":
        if self.terms.expires_at is None:
            raise ValueError("a created batch's terms say when it expires")
        return self


ISSUE_MESSAGE_CHARS = 1024
"""A rejected line's message is cut to this (it may quote the tenant's own values, which run to the line's size)."""
ISSUE_PARAM_CHARS = 128
"""A rejected line's `param` is cut to this (it may name a tenant's own key)."""


def clipped(text: str, limit: int) -> str:
    """`text`, cut to `limit` characters (the last of them an ellipsis) when longer."""
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _clipped(limit: int) -> AfterValidator:
    return AfterValidator(lambda text: text if text is None else clipped(text, limit))


class LineRejected(BatchEvent):
    """One bad line of the input file, published as soon as the validator finds it."""

    name: ClassVar = "line_rejected"
    dedup_fields: ClassVar = ("line", "code")
    type: Literal["batch.line_rejected"] = "batch.line_rejected"
    line: int | None
    code: str
    """A validation code: one `ERROR_CODE_HELP` explains, or `<parameter>_unavailable`."""
    param: Annotated[str | None, _clipped(ISSUE_PARAM_CHARS)] = None
    message: Annotated[str, _clipped(ISSUE_MESSAGE_CHARS)]
    """Clipped wherever it is made or read: a batch keeps up to 100 of them in its record, which must stay small."""
    custom_id: str | None = None
    """The line's custom_id when it had a usable one."""


class ValidationProgressed(BatchEvent):
    """How far the validator has read; published every few thousand lines and at the end."""

    name: ClassVar = "validation_progressed"
    dedup_fields: ClassVar = ("lines_read",)
    type: Literal["batch.validation_progressed"] = "batch.validation_progressed"
    lines_read: int
    errors_found: int


class BatchValidated(BatchEvent):
    """What validation found. Version 1 also restated three of the batch's terms (`owner_key_id`, `endpoint`,
    `input_object_key`), which no reader took: they are `batch.created`'s, and ignored here."""

    name: ClassVar = "validated"
    type: Literal["batch.validated"] = "batch.validated"
    version: int = 2
    total_lines: int
    model: str
    """The catalogue id every line resolved to; the batch is pinned to it."""
    rejected_lines: int = 0
    """With allow_partial: lines refused by validation; they go to the error file and never run."""
    rejections_object_key: str | None = None
    """JSONL of the refused lines (`RejectedLine`), when there are any."""
    error_count: int | None = None
    """The true number of errors (with allow_partial, of the refused lines), counted past the `LineRejected`
    facts published; None from validators before it."""
    counts_by_code: dict[str, int] | None = None
    """The true number of errors of each code (see `error_count`)."""


class BatchValidationFailed(BatchEvent):
    name: ClassVar = "validation_failed"
    type: Literal["batch.validation_failed"] = "batch.validation_failed"
    total_lines: int
    error_count: int
    """Every error found; a line may have several."""
    counts_by_code: dict[str, int] = Field(default_factory=dict)
    rejected_lines: int | None = None
    """Distinct input lines refused (a line with two errors is one); None from validators before it."""
    reason: str | None = None
    """Why validation failed, for a person: the file-level errors, then refused lines of all lines."""
    error_file_id: str | None = None
    """The error file: one line per input line, each refused line with all its codes, every other line
    `batch_failed_validation`; None when the file has no lines, or from validators before it."""


class BatchAssigned(BatchEvent):
    """One shard of the batch leased to one executor as an attempt (attempt numbers count up over the batch).

    A batch runs as `shards` shards of consecutive input lines: shard `i` is lines `i*shard_span+1` to
    `(i+1)*shard_span`, the last one open-ended. One shard (the default) is the whole file."""

    name: ClassVar = "assigned"
    dedup_fields: ClassVar = ("attempt",)
    type: Literal["batch.assigned"] = "batch.assigned"
    executor_id: str
    attempt: int
    lease_token: str
    shard: int = 0
    shards: int = 1
    shard_span: int = 0
    """Input lines per shard; 0 with a single shard."""

    @property
    def layout(self) -> "ShardLayout":
        return ShardLayout(shards=self.shards, span=self.shard_span)


class BatchStarted(BatchEvent):
    """An attempt's first line has an engine slot (an attempt waiting for the slots of others has run nothing): stated
    once per attempt, before anything else it states."""

    name: ClassVar = "started"
    dedup_fields: ClassVar = ("attempt",)
    type: Literal["batch.started"] = "batch.started"
    executor_id: str
    attempt: int
    engine: EngineName
    engine_version: str


class BatchProgressed(BatchEvent):
    """Results of more lines are durable; counts are cumulative over the attempt's shard (the whole batch when
    it has one shard), so a batch's counts are the sum over its shards."""

    name: ClassVar = "progressed"
    dedup_fields: ClassVar = ("attempt", "chunk")
    type: Literal["batch.progressed"] = "batch.progressed"
    attempt: int
    chunk: int
    chunk_key: str
    completed: int
    failed: int
    shard: int = 0
    usage: BatchUsage | None = None
    """The tokens of this chunk's own lines (not cumulative): what a billed batch is debited as it commits. None
    from executors before it."""


class ShardFinished(BatchEvent):
    """Every line of a shard of a multi-shard batch is committed, or its attempt stopped on cancel or expiry
    (`stopped`). The scheduler finalizes the batch once no shard runs."""

    name: ClassVar = "shard_finished"
    dedup_fields: ClassVar = ("attempt",)
    type: Literal["batch.shard_finished"] = "batch.shard_finished"
    attempt: int
    shard: int
    executor_id: str
    stopped: bool = False


class BatchFinalizing(BatchEvent):
    name: ClassVar = "finalizing"
    dedup_fields: ClassVar = ("attempt",)
    type: Literal["batch.finalizing"] = "batch.finalizing"
    attempt: int


class BatchEnded(BatchEvent):
    """What every ending with files shares: the files written, the final counts and the usage of its lines."""

    output_file_id: str | None
    error_file_id: str | None
    completed: int
    failed: int
    usage: BatchUsage


class BatchCompleted(BatchEnded):
    name: ClassVar = "completed"
    type: Literal["batch.completed"] = "batch.completed"


class BatchFailed(BatchEvent):
    """The batch cannot finish; `code` and `reason` name the cause. A batch that fails at run time is finalized
    first: the lines it committed are in the files below (the rest are `batch_failed` in the error file)."""

    name: ClassVar = "failed"
    type: Literal["batch.failed"] = "batch.failed"
    code: str
    """A `FailureCode` as Sheshnag writes it. A `str`, so facts already in a log still decode: `scheduling_error`
    from earlier versions, and whatever executors stated before the fact desk judged their facts."""
    reason: str
    output_file_id: str | None = None
    error_file_id: str | None = None
    completed: int | None = None
    """With the files: the lines in the output file; None when the batch failed before any file was written."""
    failed: int | None = None
    usage: BatchUsage | None = None


class BatchWaiting(BatchEvent):
    """A validated batch's standing (its place in the queue and ETA, or how far along it runs), or why no executor
    can take it yet (no executor has the model, not enough memory)."""

    name: ClassVar = "waiting"
    dedup_fields: ClassVar = ("reason", "as_of")
    type: Literal["batch.waiting"] = "batch.waiting"
    reason: str
    as_of: int = 0
    """When the scheduler judged it (ms): a standing that comes back later (4th, 3rd, 4th again) is a new fact, not
    a duplicate of the first one within the broker's deduplication window."""


class AttemptFailed(BatchEvent):
    """One attempt ended without finishing (executor lost, engine crashed); the scheduler may retry."""

    name: ClassVar = "attempt_failed"
    dedup_fields: ClassVar = ("attempt",)
    type: Literal["batch.attempt_failed"] = "batch.attempt_failed"
    attempt: int
    executor_id: str
    code: str
    """Why the attempt ended: `executor_error`, `executor_lost`, `executor_restarted`, or the batch's end
    (`batch_cancelled`, `batch_expired`, `attempts_exhausted`). A `str` for the same reason as `BatchFailed.code`."""
    reason: str


class BatchCancelRequested(BatchEvent):
    name: ClassVar = "cancel_requested"
    dedup_fields: ClassVar = ("code",)
    """One per code: the owner's cancel and a revocation's stop are two facts."""
    type: Literal["batch.cancel_requested"] = "batch.cancel_requested"
    requested_by_key_id: str
    code: CancelCode = "batch_cancelled"
    """The code lines never run get in the error file: `authorization_revoked` when the owner's key was revoked."""
    by_admin: AdminCancelCode | None = None
    """Set when someone other than the owner cancelled it: the entry the batch's `errors.data` then carries."""
    by_admin_message: str | None = None
    """That entry's message (it names the organisation's administrator)."""


class BatchCancelled(BatchEnded):
    """Cancelled: results already produced are in the output file, lines never run are `batch_cancelled`."""

    name: ClassVar = "cancelled"
    type: Literal["batch.cancelled"] = "batch.cancelled"


class BatchExpired(BatchEnded):
    """The completion window ended: finished lines kept, the rest `batch_expired` in the error file."""

    name: ClassVar = "expired"
    type: Literal["batch.expired"] = "batch.expired"


class BatchReleased(BatchEvent):
    """A held batch may run now (its owner confirmed it after seeing the validation)."""

    name: ClassVar = "released"
    type: Literal["batch.released"] = "batch.released"
    released_by_key_id: str
