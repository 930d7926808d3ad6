"""A problem found in an input file: a stable code, how to fix it, and the field at fault."""

from dataclasses import dataclass


@dataclass(frozen=True)
class LineIssue:
    code: str
    message: str
    param: str | None = None
