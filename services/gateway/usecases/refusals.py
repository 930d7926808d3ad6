"""The one refusal every entrypoint reports in OpenAI's shape (HTTP: its status and body; CLI: its message), and
request bodies parsed by their contract models into it; a number a client writes as text read one way everywhere
(`ascii_int`)."""

from typing import TypeVar

from pydantic import BaseModel, ValidationError

from contracts.api.error import ErrorBody, ErrorType
from contracts.api.field_errors import GIVEN_CHARS, REFUSED, Refusal

Body = TypeVar("Body", bound=BaseModel)


class ApiError(Exception):
    def __init__(self, status: int, message: str, type: ErrorType = "invalid_request_error",
                 code: str | None = None, param: str | None = None, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = ErrorBody(message=message, type=type, code=code, param=param)
        self.retry_after_s = retry_after_s
        """Set on rate limits: the SDK may retry after this many seconds."""


REVOKED_KEY = "This API key was revoked; ask an administrator for a new one."


def revoked_key() -> ApiError:
    """The refusal of a key revoked (at its request's admission, or while the request ran)."""
    return ApiError(401, REVOKED_KEY, "authentication_error", "invalid_api_key")


def not_found(what: str, ident: str) -> ApiError:
    return ApiError(404, f"No {what} found with id '{ident}'.", "not_found_error", "not_found", None)


def bad_request(message: str, code: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, "invalid_request_error", code, param)


def parse_body(model: type[Body], raw: bytes) -> Body:
    """`raw` (an empty body is `{}`) as `model`, or the 400 its first refused field declares."""
    try:
        return model.model_validate_json(raw or b"{}")
    except ValidationError as error:
        raise refusal_of(model, error) from None


def parse_fields(model: type[Body], fields: dict[str, object]) -> Body:
    """The same model and refusals, for a request that arrives as arguments (the CLI) rather than as JSON."""
    try:
        return model.model_validate(fields)
    except ValidationError as error:
        raise refusal_of(model, error) from None


def refusal_of(model: type[BaseModel], error: ValidationError) -> ApiError:
    # An unknown parameter is named first, as OpenAI does, whatever else is wrong.
    first = min(error.errors(), key=lambda e: e["type"] != "extra_forbidden")
    field = str(first["loc"][0]) if first["loc"] else None
    match first["type"]:
        case "json_invalid":
            return bad_request("The request body is not valid JSON.", "invalid_json")
        case "model_type" | "model_attributes_type" if field is None:
            return bad_request("The request body must be a JSON object.", "invalid_json")
        case "extra_forbidden":
            return bad_request(f"Unknown parameter: {str(field)[:GIVEN_CHARS]!r}.", "unknown_parameter",
                               str(field)[:GIVEN_CHARS])
        case "missing":
            return _missing(model, str(field))
    if first.get("ctx", {}).get(REFUSED):
        return bad_request(first["msg"], first["type"], field)
    param = ".".join(str(part) for part in first["loc"]) or None
    return bad_request(f"Invalid request: {first['msg']}.", "invalid_request", param)


def _missing(model: type[BaseModel], field: str) -> ApiError:
    info = model.model_fields.get(field)
    refusal = next((m for m in info.metadata if isinstance(m, Refusal)), None) if info is not None else None
    if refusal is None:
        return bad_request(f"Missing required parameter: {field!r}.", "missing_required_parameter", field)
    described = refusal.describe(MISSING)
    return bad_request(described.message(), described.type, field)


class _Missing:
    """What a refusal's message quotes for a parameter not sent (its `repr`), rather than `None`."""

    def __repr__(self) -> str:
        return "nothing"


MISSING = _Missing()


def ascii_int(raw: str | None, most_digits: int) -> int | None:
    """`raw` as a number if it is at most `most_digits` ASCII digits (`isdigit` alone lets `²` through), else None."""
    if raw is None or not (raw.isascii() and raw.isdigit() and len(raw) <= most_digits):
        return None
    return int(raw)
