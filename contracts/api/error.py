"""The OpenAI error envelope: {"error": {"message", "type", "param", "code"}}."""

from typing import Literal

from pydantic import BaseModel

ErrorType = Literal[
    "invalid_request_error",
    "authentication_error",
    "permission_error",
    "not_found_error",
    "conflict_error",
    "rate_limit_error",
    "server_error",
]


class ErrorBody(BaseModel):
    message: str
    """What went wrong and how to fix it, for a person."""
    type: ErrorType
    param: str | None = None
    """The request field at fault, if one is."""
    code: str | None = None
    """A stable machine-readable code."""


class ErrorResponse(BaseModel):
    error: ErrorBody
