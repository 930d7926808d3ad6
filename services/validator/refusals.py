"""What validation refused, line by line: the `RejectedLine` record of a refused line (every error it has), and
the lines of the error file of a batch that failed validation, in OpenAI's batch error-line shape."""

import hashlib

import orjson
from pydantic_core import to_json

from contracts.api.output_line import OutputError, OutputLine
from contracts.api.rejected_line import DUPLICATE_CUSTOM_ID, REFUSED_STATUS, RejectedLine
from contracts.ids import batch_request_id
from services.validator.domain import FileValidation, LineResult

BATCH_FAILED_VALIDATION = "batch_failed_validation"
"""The code of a line that did not run because validation refused the batch (other lines, or the file)."""


def rejected_line(result: LineResult) -> RejectedLine:
    """A refused line as one record: its first error's code and field (a repeated custom_id first: the line's id
    then says the custom_id is not its own), and a message naming every error."""
    issues = sorted(result.issues, key=lambda issue: issue.code != DUPLICATE_CUSTOM_ID)
    first, *others = issues
    message = first.message if not others else " ".join(
        f"[{issue.code}{f' at {issue.param}' if issue.param else ''}] {issue.message}" for issue in issues)
    return RejectedLine(line=result.line, custom_id=result.custom_id, code=first.code, param=first.param,
                        message=message)


def not_run_message(validation: FileValidation) -> str:
    """What the error file says of a line that was not refused, in a batch that failed validation."""
    if validation.file_issues:
        return "This request did not run: " + next(iter(validation.file_issues.values())).message
    return (f"This request is valid, but the batch did not run: validation refused {validation.rejected_lines} "
            "other lines. Fix them, or create the batch with allow_partial to run the valid lines.")


def not_run_output(batch_id: str, line: int, raw: bytes, message: str, checked: bool) -> OutputLine:
    """The error line of an unrefused line of a batch that failed validation. A `checked` line has its own unique
    custom_id; an unchecked one (past the line limit) is named by its line."""
    custom_id = _custom_id(raw)  # a line's id names its line when its custom_id is missing or not its own
    named = custom_id if checked and custom_id is not None else f"line:{line}"
    return OutputLine(id=batch_request_id(batch_id, named), custom_id=custom_id,
                      response=None, error=OutputError(code=BATCH_FAILED_VALIDATION, message=message))


class LineIds:
    """The hex digits of `batch_request_id(batch_id, name)` (and of the `req_` id beside it) for many names of one
    batch, its own part hashed once."""

    def __init__(self, batch_id: str) -> None:
        self.named = hashlib.sha256(f"{batch_id}\x1f".encode())
        if b"batch_req_" + self.digits("probe") != batch_request_id(batch_id, "probe").encode():
            raise ValueError("a line's id is no longer derived as contracts.ids.batch_request_id derives it")

    def digits(self, name: str) -> bytes:
        digest = self.named.copy()
        digest.update(name.encode())
        return digest.hexdigest()[:24].encode()


class NotRunLines:
    """`not_run_output(...).model_dump_json()` of one failed batch's lines, from a template the model writes once
    (they differ only in their id's hex digits and their custom_id, which the model's own JSON encoder writes)."""

    HEAD = b'{"id":"","custom_id":""'

    def __init__(self, batch_id: str, message: str) -> None:
        self.ids = LineIds(batch_id)
        sample = OutputLine(id="", custom_id="", response=None,
                            error=OutputError(code=BATCH_FAILED_VALIDATION, message=message)).model_dump_json().encode()
        if not sample.startswith(self.HEAD):
            raise ValueError(f"an error line is no longer written as {self.HEAD!r}…: {sample!r}")
        self.tail = sample.removeprefix(self.HEAD)

    def line(self, line: int, custom_id: str | None, checked: bool) -> bytes:
        """The JSON of the line that `not_run_output` gives a line of this custom_id (without its newline)."""
        digits = self.ids.digits(custom_id if checked and custom_id is not None else f"line:{line}")
        return b'{"id":"batch_req_' + digits + b'","custom_id":' + to_json(custom_id) + self.tail

    def of_raw(self, line: int, raw: bytes, checked: bool) -> bytes:
        return self.line(line, _custom_id(raw), checked)


class RefusedLines:
    """`RejectedLine.error_line(...).model_dump_json()` of one batch's refused lines, each string written by the
    model's own JSON encoder into the model's shape (checked on a sample with every field set, and one with none)."""

    def __init__(self, batch_id: str) -> None:
        self.ids = LineIds(batch_id)
        for sample in (RejectedLine(line=7, custom_id="c\"é\n", code="invalid_body", param="body.x", message="m\t"),
                       RejectedLine(line=1, custom_id=None, code=DUPLICATE_CUSTOM_ID, message="")):
            if self.line(sample) != sample.error_line(batch_id).model_dump_json().encode():
                raise ValueError("a refused line's error line is no longer written in the shape RefusedLines writes")

    def line(self, rejected: RejectedLine) -> bytes:
        """The JSON of `rejected.error_line(batch_id)` (without its newline)."""
        digits, code, message = self.ids.digits(rejected.ident()), to_json(rejected.code), to_json(rejected.message)
        return b"".join((b'{"id":"batch_req_', digits, b'","custom_id":', to_json(rejected.custom_id),
                         b',"response":{"status_code":', str(REFUSED_STATUS).encode(), b',"request_id":"req_', digits,
                         b'","body":{"error":{"message":', message, b',"type":"invalid_request_error","param":',
                         to_json(rejected.param), b',"code":', code, b'}}},"error":{"code":', code, b',"message":',
                         message, b'},"line":', str(rejected.line).encode(), b"}"))


def _custom_id(raw: bytes) -> str | None:
    try:
        request = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    custom_id = request.get("custom_id") if isinstance(request, dict) else None
    return custom_id if isinstance(custom_id, str) else None
