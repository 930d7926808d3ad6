"""A line refused by validation, as recorded for a partial batch (one JSON object per line)."""

from pydantic import BaseModel


class RejectedLine(BaseModel):
    line: int
    """1-based line of the input file."""
    custom_id: str | None
    code: str
    """A validation code (see `LineRejected.code`)."""
    param: str | None = None
    message: str
