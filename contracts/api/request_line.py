"""One line of a batch input file, once it has parsed."""

from typing import Literal

from pydantic import BaseModel, ConfigDict

REQUIRED_LINE_FIELDS: tuple[str, ...] = ("custom_id", "method", "url", "body")
MAX_CUSTOM_ID_LENGTH = 512
MAX_NESTING_DEPTH = 64
"""Arrays and objects nested in one line, the line itself counted. Every later stage must re-serialise a body:
orjson dumps at most 254 levels, the stdlib `json` about 1,000, llama.cpp's grammar builder recurses per level."""


class RequestLine(BaseModel):
    model_config = ConfigDict(extra="forbid")

    custom_id: str
    """The caller's id for the line, echoed verbatim in the output."""
    method: Literal["POST"]
    url: str
    body: dict[str, object]
    """The request body, as the endpoint takes it."""
