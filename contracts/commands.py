"""Commands sent to one executor on the WORK stream (not facts: they are consumed and gone)."""

import json
from typing import ClassVar

from pydantic import BaseModel, Field

from contracts.events.batch import CancelCode, FailureCode, ShardLayout
from contracts.events.executor import ExecutorAdvert
from contracts.lifecycle import EndReason
from contracts.permissions import EXECUTOR_ID_PATTERN
from contracts.subjects import finalize_command, run_command
from contracts.terms import WithTerms

COMMAND_PROTOCOL = 2
"""The newest shape of commands (`ExecutorAdvert.protocol`): 2 carries the batch's terms nested (`terms`); 1, which
every executor takes, states each term as a field of its own."""


class BatchCommand(WithTerms):
    """A command about one batch, for one executor, carrying the batch's terms."""

    flat_fields: ClassVar[tuple[str, ...]]
    """The command's fields in protocol 1, in the order it wrote them."""

    batch_id: str
    executor_id: str

    def wire(self, protocol: int) -> bytes:
        """The command as an executor that speaks `protocol` takes it: its terms nested from protocol 2 on, else
        flat, byte for byte as protocol 1 wrote it."""
        if protocol >= 2:
            return self.model_dump_json().encode()
        fields = self.model_dump(mode="json")
        fields |= fields.pop("terms")
        return json.dumps({name: fields[name] for name in self.flat_fields}, ensure_ascii=False,
                          separators=(",", ":")).encode()


class RunBatch(BatchCommand):
    """Run every line of a validated batch that no earlier attempt committed."""

    flat_fields = ("batch_id", "executor_id", "attempt", "lease_token", "owner_key_id", "model", "endpoint",
                   "input_object_key", "total_lines", "rejections_object_key", "shard", "layout",
                   "output_expires_after_s", "created_at", "expires_at")

    attempt: int
    lease_token: str
    model: str
    total_lines: int
    rejections_object_key: str | None = None
    """Lines validation refused (allow_partial): never run, they go to the error file with their codes."""
    shard: int = 0
    layout: ShardLayout = ShardLayout()
    """The batch's split into shards; this attempt runs shard `shard` of it (one shard: the whole file)."""

    @property
    def sharded(self) -> bool:
        return self.layout.shards > 1

    @property
    def subject(self) -> str:
        return run_command(self.executor_id)

    @property
    def msg_id(self) -> str:
        return f"{self.batch_id}:run:{self.attempt}"


class FinalizeBatch(BatchCommand):
    """Write the output and error files of a batch that ends without an attempt finalizing it: cancelled,
    expired, completed by several shards, or failed at run time (`failure_code`, `failure_message`: why).

    Lines committed by any attempt are kept; every other line goes to the error file with `code`.
    Sent to the one executor the scheduler chose to finalize the batch (`executor_id`: only it may take this
    command, read the batch's objects and state its end).
    """

    flat_fields = ("batch_id", "executor_id", "reason", "owner_key_id", "input_object_key", "endpoint",
                   "unrun_code", "output_expires_after_s", "created_at", "failure_code", "failure_message")

    reason: EndReason
    unrun_code: CancelCode | None = None
    """For a cancel: the code of lines never run, when not `batch_cancelled` (a revoked key)."""
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


MIN_ACK_WAIT_S, MAX_ACK_WAIT_S = 1.0, 3600.0
MAX_RUN_DELIVERIES = 100


class ExecutorRegistration(BaseModel):
    """An executor asking to join the fleet, proving itself with a worker key (sent as a request, never stored)."""

    executor_id: str = Field(pattern=f"^{EXECUTOR_ID_PATTERN}$")
    worker_key: str = Field(max_length=256)
    advert: ExecutorAdvert
    ack_wait_s: float = Field(default=30.0, ge=MIN_ACK_WAIT_S, le=MAX_ACK_WAIT_S)
    """How long a command it took may go unacknowledged before it is delivered again (its durables' ack wait)."""
    max_deliver: int = Field(default=5, ge=1, le=MAX_RUN_DELIVERIES)
    """Deliveries of one run command before its attempt fails."""


class RegistrationAnswer(BaseModel):
    accepted: bool
    reason: str | None = None
    worker_key_id: str | None = None
    retry: bool = False
    """Not accepted yet, not refused: ask again shortly (the scheduler is still reading the log)."""


class AdvertUpdate(BaseModel):
    """An admitted executor's advert for a scheduler to write under its key in the executors bucket (the subject says
    whose); None: withdraw it (the executor stops)."""

    advert: ExecutorAdvert | None


class AdvertReceipt(BaseModel):
    stored: bool
    reason: str | None = None
    registered: bool | None = None
    """Whether the leading scheduler counts the executor registered (False: lost, or never registered: it registers
    again, a new fencing epoch, before beating on); None: not known yet (the leader is still reading the log)."""


class AdmissionAsk(BaseModel):
    """An admitted executor asking how long an admission to the broker lasts (`AdmissionTerms`)."""


class AdmissionTerms(BaseModel):
    """How long the broker admits an executor's connection (the auth callout's JWT lifetime): it renews its own
    admission before that much time has passed since it connected."""

    ttl_s: float | None = Field(default=None, ge=0)
    """None: admissions do not expire."""
