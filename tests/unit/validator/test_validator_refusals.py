"""What validation refused, as the records and error-file lines a user reads to fix a file."""

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.api.rejected_line import RejectedLine
from contracts.ids import batch_request_id
from services.validator.domain import LineResult
from services.validator.issues import LineIssue
from services.validator.refusals import BATCH_FAILED_VALIDATION, RefusedLines, not_run_output, rejected_line

BATCH = "batch_r1"


def test_a_line_with_several_errors_is_one_record_naming_every_error() -> None:
    result = LineResult(3, "a", [LineIssue("invalid_method", "Use POST.", "method"),
                                 LineIssue("unknown_fields", "Drop extra.")])
    record = rejected_line(result)
    assert (record.line, record.code, record.param) == (3, "invalid_method", "method")
    assert record.message == "[invalid_method at method] Use POST. [unknown_fields] Drop extra."


def test_a_repeated_custom_id_comes_first_so_the_line_is_named_by_its_number() -> None:
    result = LineResult(4, "a", [LineIssue("invalid_method", "Use POST.", "method"),
                                 LineIssue("duplicate_custom_id", "Used on line 1.", "custom_id")])
    output = rejected_line(result).error_line(BATCH)
    assert output.error is not None and output.error.code == "duplicate_custom_id"
    assert output.id == batch_request_id(BATCH, "line:4") != batch_request_id(BATCH, "a")
    assert output.custom_id == "a" and output.line == 4


def test_a_refused_lines_error_line_carries_its_line_and_the_400_the_regular_call_would_answer() -> None:
    result = LineResult(3, "q3", [LineIssue("stop_unavailable", "stop is not offered.", "body.stop")])
    line = orjson.loads(rejected_line(result).error_line(BATCH).model_dump_json())
    assert line["line"] == 3 and line["custom_id"] == "q3"
    assert line["error"] == {"code": "stop_unavailable", "message": "stop is not offered."}
    assert line["response"]["status_code"] == 400 and line["response"]["request_id"].startswith("req_")
    assert line["response"]["body"] == {"error": {"message": "stop is not offered.", "type": "invalid_request_error",
                                                  "param": "body.stop", "code": "stop_unavailable"}}


def test_a_line_that_did_not_run_keeps_its_custom_id_and_says_why() -> None:
    raw = orjson.dumps({"custom_id": "ok", "method": "POST"})
    checked = not_run_output(BATCH, 2, raw, "Other lines failed.", checked=True)
    assert (checked.id, checked.custom_id) == (batch_request_id(BATCH, "ok"), "ok")
    assert checked.error is not None and checked.error.code == BATCH_FAILED_VALIDATION
    unchecked = not_run_output(BATCH, 9, raw, "Too many.", checked=False)
    assert unchecked.id == batch_request_id(BATCH, "line:9"), "an unchecked custom_id may repeat an earlier one"
    assert not_run_output(BATCH, 10, b"{oops", "Too many.", checked=False).custom_id is None
    assert "line" not in orjson.loads(checked.model_dump_json()), "only a refused line names its input line"
    assert checked.response is None, "a line the batch stopped has no response, as OpenAI's have none"


@settings(max_examples=400, deadline=None)
@given(st.integers(1, 10**6), st.text(max_size=40) | st.none(), st.sampled_from(
    ["invalid_json", "duplicate_custom_id", "context_too_long", "invalid_body"]) | st.text(max_size=20),
       st.text(max_size=30) | st.none(), st.text(max_size=200), st.text(min_size=1, max_size=30))
def test_a_refused_lines_error_line_is_written_as_the_model_writes_it(
        line: int, custom_id: str | None, code: str, param: str | None, message: str, batch_id: str) -> None:
    record = RejectedLine(line=line, custom_id=custom_id, code=code, param=param, message=message)
    assert RefusedLines(batch_id).line(record) == record.error_line(batch_id).model_dump_json().encode()
