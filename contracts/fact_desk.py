"""Executors and the event log: they never write or read EVENTS themselves; the leading scheduler's fact desk does,
for the batches they hold. These are the messages of that exchange (requests on subjects only the executor may
publish to, so the subject says who asks).

A submitted fact is stored only if the executor is entitled to state it (its own attempt of a batch it holds, or
the files and end of a batch it finalizes); a log read returns only the facts that running or finalizing a batch
needs, never its creation (owner, input object, metadata) or its validation.
"""

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

ATTEMPT_FACTS = ("started", "progressed", "shard_finished", "attempt_failed")
"""Batch facts of one attempt (each names it): only the executor the attempt was assigned to states them."""
FINALIZER_FACTS = ("finalizing", "completed", "cancelled", "expired", "failed")
"""Batch facts of its end: only the executor that finalizes the batch states them (with its output and error
files' `file.stored`)."""

EXECUTION_FACTS = ("assigned", "started", "progressed", "shard_finished", "attempt_failed", "cancel_requested",
                   "finalizing", "completed", "cancelled", "expired", "failed")
"""The batch facts a log read returns: those that say which attempt runs, what it committed and how the batch
ends (the executor's `BatchLog` folds nothing else)."""

LOG_PAGE_FACTS = 256
"""Facts per log page at most; a page also stays under a quarter of NATS' default 1 MiB payload."""
LOG_PAGE_BYTES = 256 * 1024
FACTS_PER_SUBMISSION = 4
"""Facts one submission carries at most: an attempt's last progress and its end, or a batch's files and its end."""


class FenceCondition(BaseModel):
    """Store the fact only while the last fact on `subject` is still the one at `sequence` (see `bus.Fence`)."""

    model_config = ConfigDict(frozen=True)

    subject: str
    sequence: int


MAX_STATED_FACT_CHARS = 16_384
"""The most an executor's fact may hold as JSON: the largest it states (an end with its usage, a result file's
announcement, a failure's reason of up to 1,000 characters) is a few kB; the log keeps every fact for good."""
StatedFact = Annotated[str, Field(max_length=MAX_STATED_FACT_CHARS)]


class FactSubmission(BaseModel):
    """Facts an executor asks to be stored, in order, as JSON of their contract events: `event`, then each of
    `then`. Each is judged and stored as if it came alone, under the same fence; the first that is not stored
    ends the submission (those before it stay stored: a retry of the whole submission repeats them harmlessly)."""

    model_config = ConfigDict(frozen=True)

    event: StatedFact
    fence: FenceCondition | None = None
    then: list[StatedFact] = Field(default=[], max_length=FACTS_PER_SUBMISSION - 1)


ReceiptStatus = Literal["stored", "fence_moved", "refused", "retry"]


class FactReceipt(BaseModel):
    status: ReceiptStatus
    """`stored` (or was already: a retry of the same fact); `fence_moved`: the condition no longer holds, nothing
    was written; `refused`: the executor may not state this fact; `retry`: the desk cannot judge yet. Of several
    facts: that of the first not stored, else `stored`."""
    sequence: int = 0
    """`stored`: the (last) fact's stream sequence; `fence_moved`: the last sequence on the fence's subject."""
    reason: str | None = None


MAX_SEQUENCE = 2**63 - 1
"""The highest stream sequence a read may start after: the desk asks the broker for `after + 1` in JSON its encoder
writes only within 64 bits (a larger number was a traceback and no answer)."""


class LogRead(BaseModel):
    model_config = ConfigDict(frozen=True)

    batch_id: str
    after: int = Field(default=0, ge=0, le=MAX_SEQUENCE)
    """Facts with a stream sequence above this one."""


class LoggedFact(BaseModel):
    sequence: int
    event: str
    """JSON of the contract event; empty for a placeholder that only carries the page's last sequence on."""


class LogPage(BaseModel):
    status: Literal["read", "refused", "retry"]
    facts: list[LoggedFact] = []
    more: bool = False
    """More facts follow this page: read again after its last sequence."""
    reason: str | None = None
