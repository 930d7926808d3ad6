"""Commands sent to one executor on the WORK stream (not facts: they are consumed and gone)."""


from pydantic import BaseModel, ConfigDict, Field

from contracts.api.batch import Endpoint
from contracts.events.batch import CancelCode, FailureCode, ShardLayout
from contracts.events.executor import ExecutorAdvert
from contracts.lifecycle import EndReason
from contracts.permissions import EXECUTOR_ID_PATTERN
from contracts.subjects import finalize_command, run_command


class RunBatch(BaseModel):
    """Run every line of a validated batch that no earlier attempt committed."""

    model_config = ConfigDict(frozen=True)

    batch_id: str
    executor_id: str
    attempt: int
    lease_token: str
    owner_key_id: str
    """Owner of the batch, and so of its output and error files."""
    model: str
    endpoint: Endpoint
    input_object_key: str
    total_lines: int
    rejections_object_key: str | None = None
    """Lines validation refused (allow_partial): never run, they go to the error file with their codes."""
    shard: int = 0
    layout: ShardLayout = ShardLayout()
    """The batch's split into shards; this attempt runs shard `shard` of it (one shard: the whole file)."""
    output_expires_after_s: int | None = None
    """Output and error files expire this long after the batch was created (`output_expires_after`)."""
    created_at: int = 0
    """When the batch was created (seconds since the epoch): the anchor of `output_expires_after`."""
    expires_at: int | None = None
    """When the batch expires (seconds since the epoch): no line starts after it."""

    @property
    def sharded(self) -> bool:
        return self.layout.shards > 1

    @property
    def subject(self) -> str:
        return run_command(self.executor_id)

    @property
    def msg_id(self) -> str:
        return f"{self.batch_id}:run:{self.attempt}"


class FinalizeBatch(BaseModel):
    """Write the output and error files of a batch that ends without an attempt finalizing it: cancelled,
    expired, completed by several shards, or failed at run time (`failure_code`, `failure_message`: why).

    Lines committed by any attempt are kept; every other line goes to the error file with `code`.
    Sent to the one executor the scheduler chose to finalize the batch (only it may read the batch's objects and
    state its end).
    """

    model_config = ConfigDict(frozen=True)

    batch_id: str
    executor_id: str
    """The executor chosen to finalize the batch: the only one who may take this command."""
    reason: EndReason
    owner_key_id: str
    input_object_key: str
    endpoint: Endpoint
    unrun_code: CancelCode | None = None
    """For a cancel: the code of lines never run, when not `batch_cancelled` (a revoked key)."""
    output_expires_after_s: int | None = None
    created_at: int = 0
    failure_code: FailureCode | None = None
    """For a failed batch: the cause's code (e.g. `attempts_exhausted`), carried into `batch.failed`."""
    failure_message: str | None = None

    @property
    def code(self) -> str:
        if self.reason == "completed":
            return "line_not_run"  # every shard finished, so none should be left: kept safe, never dropped
        return self.unrun_code or f"batch_{self.reason}"

    @property
    def subject(self) -> str:
        return finalize_command(self.executor_id)

    @property
    def msg_id(self) -> str:
        # Per executor: the broker dedups a msg id over the whole stream, and a resend to another must not drop.
        return f"{self.batch_id}:finalize:{self.reason}:{self.executor_id}"


class ExecutorRegistration(BaseModel):
    """An executor asking to join the fleet, proving itself with a worker key (sent as a request, never stored)."""

    executor_id: str = Field(pattern=f"^{EXECUTOR_ID_PATTERN}$")
    worker_key: str = Field(max_length=256)
    advert: ExecutorAdvert


class RegistrationAnswer(BaseModel):
    accepted: bool
    reason: str | None = None
    worker_key_id: str | None = None
    retry: bool = False
    """Not accepted yet, not refused: ask again shortly (the scheduler is still reading the log)."""
