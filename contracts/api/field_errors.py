"""How a request field says no: the OpenAI error `code` and message its contract declares for any bad value."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError, WrapValidator
from pydantic_core import PydanticCustomError

GIVEN_CHARS = 128
"""A refused value is quoted in the message, cut to this many characters."""
REFUSED = "refused_as"
"""Marks an error's context: its type is the code its field declares, its message the one to show."""


@dataclass(frozen=True)
class Refusal(WrapValidator):
    """The field's error: kept beside the validator so a missing field gets the same code and message."""

    code: str = ""
    message: str = ""

    def describe(self, value: object) -> PydanticCustomError:
        return PydanticCustomError(self.code, self.message, {"given": repr(value)[:GIVEN_CHARS], REFUSED: True})


def refused_as(code: str, message: str) -> Refusal:
    """Any failure of the field it annotates (type, bound or pattern) becomes one error of type `code`, whose
    message may quote the value sent as `{given}`; entrypoints turn the type into the error's `code`."""

    def validate(value: object, handler: Callable[[object], Any]) -> Any:
        try:
            return handler(value)
        except ValidationError:
            raise refusal.describe(value) from None

    refusal = Refusal(validate, code=code, message=message)
    return refusal
