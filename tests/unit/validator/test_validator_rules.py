"""The validator's rules, line by line and file-wide, as a user meets them."""

import orjson

from contracts.catalogue import Catalogue
from services.validator.domain import FileValidation, Limits

CHAT = "/v1/chat/completions"


def line(custom_id: str = "r1", model: str = "smollm2", **overrides: object) -> bytes:
    request: dict[str, object] = {
        "custom_id": custom_id, "method": "POST", "url": CHAT,
        "body": {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
    }
    request.update(overrides)
    return orjson.dumps(request)


def codes(validation: FileValidation, *lines: bytes) -> list[list[str]]:
    return [[issue.code for issue in validation.feed(n, raw)] for n, raw in enumerate(lines, start=1)]


def test_a_good_file_passes_and_pins_the_alias_to_the_catalogue_id(catalogue: Catalogue) -> None:
    validation = FileValidation(CHAT, catalogue)
    assert codes(validation, line("a"), line("b", model="smollm2-135m-instruct-q4_1")) == [[], []]
    assert validation.finish() == []
    assert validation.passed and validation.model_id == "smollm2-135m-instruct-q4_1"


def test_a_line_that_is_not_json_is_rejected_as_invalid_json(catalogue: Catalogue) -> None:
    validation = FileValidation(CHAT, catalogue)
    assert codes(validation, b'{"custom_id": "a",') == [["invalid_json"]]
    assert not validation.passed


def test_each_missing_field_is_named_in_param(catalogue: Catalogue) -> None:
    validation = FileValidation(CHAT, catalogue)
    issues = validation.feed(1, b'{"custom_id": "a", "method": "POST"}')
    assert [(i.code, i.param) for i in issues] == [("missing_field", "url"), ("missing_field", "body")]


def test_duplicate_custom_id_is_rejected_with_the_line_of_its_first_use(catalogue: Catalogue) -> None:
    validation = FileValidation(CHAT, catalogue)
    validation.feed(1, line("same"))
    issues = validation.feed(2, line("same"))
    assert [i.code for i in issues] == ["duplicate_custom_id"]
    assert "line 1" in issues[0].message


def test_an_unknown_model_is_unsupported_and_the_message_lists_what_is_served(catalogue: Catalogue) -> None:
    issues = FileValidation(CHAT, catalogue).feed(1, line(model="gpt-4o"))
    assert [(i.code, i.param) for i in issues] == [("unsupported_model", "body.model")]
    assert "smollm2-135m-instruct-q4_1" in issues[0].message


def test_lines_must_share_one_model_and_the_batch_endpoint(catalogue: Catalogue) -> None:
    validation = FileValidation(CHAT, catalogue)
    assert codes(validation, line("a"), line("b", url="/v1/completions")) == [[], ["url_mismatch"]]


def test_streaming_and_wrong_methods_and_extra_fields_are_each_reported(catalogue: Catalogue) -> None:
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "x"}], "stream": True}
    raw = orjson.dumps({"custom_id": "a", "method": "GET", "url": CHAT, "body": body, "extra": 1})
    found = {i.code for i in FileValidation(CHAT, catalogue).feed(1, raw)}
    assert found == {"stream_not_supported", "invalid_method", "unknown_fields"}


def test_blank_lines_are_skipped_and_an_empty_file_is_an_error(catalogue: Catalogue) -> None:
    validation = FileValidation(CHAT, catalogue)
    assert codes(validation, b"", b"   ") == [[], []]
    assert [i.code for i in validation.finish()] == ["empty_file"]


def test_lines_past_the_limit_are_too_many_tasks(catalogue: Catalogue) -> None:
    validation = FileValidation(CHAT, catalogue, Limits(max_lines=2))
    assert codes(validation, line("a"), line("b"), line("c")) == [[], [], ["too_many_tasks"]]


def test_counts_by_code_add_up_to_the_true_total(catalogue: Catalogue) -> None:
    validation = FileValidation(CHAT, catalogue)
    codes(validation, b"nope", b"nope", line("a", model="x"), line("b"))
    assert validation.error_count == 3
    assert validation.counts_by_code == {"invalid_json": 2, "unsupported_model": 1}


def test_a_file_past_the_line_limit_has_one_too_many_tasks_error_at_its_first_line_past_it(
        catalogue: Catalogue) -> None:
    validation = FileValidation(CHAT, catalogue, Limits(max_lines=2))
    found = codes(validation, line("a"), line("b"), line("c"), b"not even json", line("e"))
    assert found == [[], [], ["too_many_tasks"], [], []], "lines past the first one over the limit are not checked"
    assert (validation.error_count, validation.counts_by_code) == (1, {"too_many_tasks": 1})
    assert (validation.total_lines, validation.rejected_lines, validation.limit_line) == (5, 1, 3)
    assert validation.unchecked(4) and not validation.unchecked(3)
    assert not validation.passed and not validation.partial_run_possible, "too big even for allow_partial"
    assert validation.failure_reason().startswith("The file has more than 2 requests")


def test_the_failure_reason_counts_refused_lines_apart_from_their_errors(catalogue: Catalogue) -> None:
    validation = FileValidation(CHAT, catalogue)
    two_errors = line("a", method="GET", extra=1)
    assert codes(validation, two_errors, b"nope") == [["unknown_fields", "invalid_method"], ["invalid_json"]]
    assert (validation.error_count, validation.rejected_lines) == (3, 2)
    assert validation.failure_reason() == "2 of 2 input lines failed validation (3 errors)."
