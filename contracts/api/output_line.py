"""One line of a batch output or error file, in OpenAI's batch output shape."""

from typing import Any

from pydantic import BaseModel, SerializerFunctionWrapHandler, model_serializer


class OutputResponse(BaseModel):
    status_code: int
    request_id: str
    body: dict[str, object]
    """The endpoint's response: the completion, or `{"error": {...}}` for a failed line."""


class OutputError(BaseModel):
    code: str
    """A validation code, the code of a line never run (`batch_cancelled`, `batch_expired`, …) or the engine's
    own: a `str`, as engines name their errors themselves."""
    message: str


class OutputLine(BaseModel):
    id: str
    custom_id: str | None
    """Echoed verbatim; None only for a line refused by validation that had no usable custom_id."""
    response: OutputResponse | None = None
    error: OutputError | None = None
    line: int | None = None
    """The 1-based input line, on a line validation refused (absent from every other line)."""

    @model_serializer(mode="wrap")
    def _without_absent_line(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        dumped: dict[str, Any] = handler(self)
        if dumped.get("line", 0) is None:
            del dumped["line"]
        return dumped


class CommittedLine(BaseModel):
    """The result of one input line as a result chunk stores it (`results/<batch>/attempt-N/chunk-M.jsonl`): written
    by executors, read by the finalizer and by `GET /v1/batches/{id}/results` while the batch runs."""

    line: int
    custom_id: str | None
    output: OutputLine

    @property
    def key(self) -> int:
        """Its identity in the batch: the input line (a custom_id may repeat among lines validation refused)."""
        return self.line

    @property
    def succeeded(self) -> bool:
        response = self.output.response
        return response is not None and 200 <= response.status_code < 300


def decode_chunk(data: bytes) -> list[CommittedLine]:
    """A result chunk's lines (one `CommittedLine` of JSON a line); a ValueError for one that is not."""
    return [CommittedLine.model_validate_json(raw) for raw in data.splitlines() if raw.strip()]
