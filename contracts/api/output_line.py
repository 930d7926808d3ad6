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
