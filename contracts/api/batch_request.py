"""The body of `POST /v1/batches`, as the OpenAI SDK sends it (plus Sheshnag's `allow_partial`)."""

from typing import Literal

from pydantic import BaseModel, Field

from contracts.api.batch import Endpoint


class ExpiresAfter(BaseModel):
    anchor: Literal["created_at"]
    seconds: int = Field(ge=3600, le=2592000)
    """How long after creation the file expires."""


class BatchCreateRequest(BaseModel):
    input_file_id: str
    """A file uploaded with purpose `batch`."""
    endpoint: Endpoint
    completion_window: str = Field(pattern=r"^[0-9]+h$", examples=["24h"])
    """`24h` up to `168h`."""
    metadata: dict[str, str] | None = Field(default=None, max_length=16)
    """At most 16 pairs; keys up to 64 characters, values up to 512."""
    output_expires_after: ExpiresAfter | None = None
    allow_partial: bool = False
    """Extension: run the valid lines; refused lines go to the error file."""
    hold: bool = False
    """Extension: validate only; the batch runs after `POST /v1/batches/{id}/release`."""
