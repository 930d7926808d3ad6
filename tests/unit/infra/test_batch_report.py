"""What `sheshnag batch` prints when lines failed: each kind of error with its count, first lines, field, an example
and the fix (as the dashboard shows `GET /v1/batches/{id}/errors`), and the error file's lines by why."""

from contracts.api.error_codes import BatchErrorSummary, ErrorGroup, FailedLineGroup, help_for
from infra.batch_report import render_errors


def group(code: str, count: int, lines: list[int], param: str | None, message: str) -> ErrorGroup:
    guide = help_for(code)
    return ErrorGroup(code=code, count=count, lines=lines, param=param, example_message=message, title=guide.title,
                      fix=guide.fix)


def test_a_failed_validation_prints_each_kind_with_its_lines_and_fix() -> None:
    summary = BatchErrorSummary(batch_id="batch_1", total=8, groups=[
        group("invalid_json", 7, [2, 3, 5, 7, 9], None, "The line is not valid JSON (unexpected end of data)."),
        group("unsupported_model", 1, [4], "body.model", "Model 'nope' is not served here."),
    ], failed_lines=12, failed_by_code=[
        FailedLineGroup(code="invalid_json", stage="refused", count=7, title=help_for("invalid_json").title),
        FailedLineGroup(code="batch_failed_validation", stage="not_run", count=5, title="Batch failed validation"),
    ])
    shown = render_errors(summary).splitlines()
    assert shown[0] == "8 problems found, of 2 kinds:"
    assert shown[1] == "  Line is not valid JSON (invalid_json) x 7: lines 2, 3, 5, 7, 9, …"
    assert shown[2] == "    The line is not valid JSON (unexpected end of data)."
    assert shown[3] == f"    Fix: {help_for('invalid_json').fix}"
    assert shown[4] == "  Model not available (unsupported_model) x 1: line 4, field body.model"
    assert shown[-1] == ("12 failed lines in the error file: invalid_json x 7 (refused by validation), "
                         "batch_failed_validation x 5 (never ran)")


def test_a_batch_without_errors_prints_nothing() -> None:
    assert render_errors(BatchErrorSummary(batch_id="batch_1", total=0, groups=[])) == ""


def test_a_file_level_error_names_the_whole_file() -> None:
    summary = BatchErrorSummary(batch_id="batch_1", total=1, groups=[
        group("empty_file", 1, [], None, "The file has no requests.")])
    assert "  File has no requests (empty_file) x 1: the whole file" in render_errors(summary).splitlines()
