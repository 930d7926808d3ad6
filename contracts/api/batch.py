"""The batch object as `GET /v1/batches/{id}` returns it, with Sheshnag's additive extensions."""

from typing import Final, Literal, get_args

from pydantic import BaseModel, Field

BatchStatus = Literal[
    "validating",
    "validated",
    "failed",
    "in_progress",
    "finalizing",
    "completed",
    "expired",
    "cancelling",
    "cancelled",
]
"""OpenAI's statuses plus `validated`: the file is good and waits for an executor. Which of them have ended,
run, or may be cancelled or released: `contracts.lifecycle`."""

Endpoint = Literal["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"]
SUPPORTED_ENDPOINTS: Final[tuple[Endpoint, ...]] = get_args(Endpoint)

Placement = Literal["approved_providers", "own_organization"]
"""Where a batch may run: `approved_providers` (the default) on the platform's own executors, on providers a
platform admin approved, on providers an administrator of the batch's organisation approved for it, and on the
organisation's own providers; `own_organization` only on providers of the batch's own organisation."""


class BatchError(BaseModel):
    code: str
    """Stable error code, e.g. `invalid_json`, `duplicate_custom_id`. A `str`: validation codes include
    `<parameter>_unavailable` for any parameter an engine cannot honour."""
    line: int | None = None
    """1-based line of the input file, when the error is about one line."""
    message: str
    param: str | None = None
    """The offending field, JSON-path style (`body.model`)."""


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchError] = Field(default_factory=list)
    """The first errors found (at most 100)."""
    total: int = 0
    """Extension: the true number of errors, kept or not."""
    counts_by_code: dict[str, int] = Field(default_factory=dict)
    """Extension: how many errors of each code."""


class RequestCounts(BaseModel):
    total: int = 0
    completed: int = 0
    failed: int = 0


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class BatchUsage(BaseModel):
    input_tokens: int = 0
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int = 0
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int = 0


class BatchAttempt(BaseModel):
    """Extension: one attempt of a batch (a unit of its lines leased to one executor), and where it ran."""

    attempt: int
    executor_id: str
    provider_id: str | None = None
    """The provider whose worker key the executor joined with; null: one of the platform's own executors."""


class Batch(BaseModel):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: Endpoint
    input_file_id: str
    completion_window: str
    status: BatchStatus
    created_at: int
    errors: BatchErrors | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts = Field(default_factory=RequestCounts)
    metadata: dict[str, str] | None = None
    model: str | None = None
    """The catalogue id the batch is pinned to once validated."""
    usage: BatchUsage | None = None
    held: bool | None = None
    """Extension: created with `hold`; validated batches wait for `POST /v1/batches/{id}/release`."""
    status_reason: str | None = None
    """Extension: why the batch is in its status (e.g. why it failed or waits)."""
    placement: Placement | None = None
    """Extension: where the batch may run, as created (`approved_providers` unless it asked otherwise)."""
    attempts: list[BatchAttempt] | None = None
    """Extension: every attempt assigned so far, in order, with the executor and provider it went to."""
