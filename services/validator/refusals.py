"""What validation refused, line by line: the `RejectedLine` record of a refused line (every error it has), and
the lines of the error file of a batch that failed validation, in OpenAI's batch error-line shape."""

import orjson
from pydantic_core import to_json

from contracts.api.output_line import OutputError, OutputLine
from contracts.api.rejected_line import DUPLICATE_CUSTOM_ID, RejectedLine
from contracts.ids import batch_request_id
from services.validator.domain import FileValidation, LineResult

BATCH_FAILED_VALIDATION = "batch_failed_validation"
"""The code of a line that did not run because validation refused the batch (other lines, or the file)."""


def rejected_line(result: LineResult) -> RejectedLine:
    """A refused line as one record: its first error's code and field, and a message naming every error.

    A repeated custom_id comes first: the line's id in the files then says the custom_id is not its own."""
    issues = sorted(result.issues, key=lambda issue: issue.code != DUPLICATE_CUSTOM_ID)
    first, *others = issues
    message = first.message if not others else " ".join(
        f"[{issue.code}{f' at {issue.param}' if issue.param else ''}] {issue.message}" for issue in issues)
    return RejectedLine(line=result.line, custom_id=result.custom_id, code=first.code, param=first.param,
                        message=message)


def line_id(batch_id: str, line: int, custom_id: str | None) -> str:
    """A line's id in the files: by its custom_id, by its line when that is missing or was not its own."""
    return batch_request_id(batch_id, custom_id if custom_id is not None else f"line:{line}")


def not_run_message(validation: FileValidation) -> str:
    """What the error file says of a line that was not refused, in a batch that failed validation."""
    if validation.file_issues:
        return "This request did not run: " + next(iter(validation.file_issues.values())).message
    return (f"This request is valid, but the batch did not run: validation refused {validation.rejected_lines} "
            "other lines. Fix them, or create the batch with allow_partial to run the valid lines.")


def not_run_output(batch_id: str, line: int, raw: bytes, message: str, checked: bool) -> OutputLine:
    """The error line of a line that was not refused but did not run, because the batch failed validation.
    A `checked` line has its own unique custom_id; an unchecked one (past the line limit) is named by its line."""
    custom_id = _custom_id(raw)
    return OutputLine(id=line_id(batch_id, line, custom_id if checked else None), custom_id=custom_id,
                      response=None, error=OutputError(code=BATCH_FAILED_VALIDATION, message=message))


class NotRunLines:
    """The error-file lines of the lines of one failed batch that were not refused, as bytes: what `not_run_output`
    and its `model_dump_json` give, from a template the model writes once (such lines differ only in their id and
    custom_id, which the model's own JSON encoder writes)."""

    HEAD = b'{"id":"","custom_id":""'

    def __init__(self, batch_id: str, message: str) -> None:
        self.batch_id = batch_id
        sample = OutputLine(id="", custom_id="", response=None,
                            error=OutputError(code=BATCH_FAILED_VALIDATION, message=message)).model_dump_json().encode()
        if not sample.startswith(self.HEAD):
            raise ValueError(f"an error line is no longer written as {self.HEAD!r}…: {sample!r}")
        self.tail = sample.removeprefix(self.HEAD)

    def line(self, line: int, custom_id: str | None, checked: bool) -> bytes:
        """The JSON of the line that `not_run_output` gives a line of this custom_id (without its newline)."""
        ident = line_id(self.batch_id, line, custom_id if checked else None)
        return b'{"id":' + to_json(ident) + b',"custom_id":' + to_json(custom_id) + self.tail

    def of_raw(self, line: int, raw: bytes, checked: bool) -> bytes:
        return self.line(line, _custom_id(raw), checked)


def _custom_id(raw: bytes) -> str | None:
    try:
        request = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    custom_id = request.get("custom_id") if isinstance(request, dict) else None
    return custom_id if isinstance(custom_id, str) else None
