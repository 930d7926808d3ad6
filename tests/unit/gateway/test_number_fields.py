"""Numbers in form fields, query strings and headers: only ASCII digits count, so a value `int` cannot read (a
superscript, another script's digits, thousands of digits) is a 400 naming its parameter, never a 500."""

import pytest

from services.gateway.http.paging import limit_of
from services.gateway.usecases.refusals import ApiError, ascii_int
from services.gateway.views.files import expires_after_seconds
from services.gateway.views.results import DEFAULT_LIMIT, MAX_LIMIT, _cursor

UNREADABLE = ["²", "1²", "٣", "一", "", "-1", "1.5", " 7", "9" * 5000]


@pytest.mark.parametrize("raw", UNREADABLE)
def test_only_ascii_digits_within_the_bound_are_a_number(raw: str) -> None:
    assert ascii_int(raw, 12) is None


def test_ascii_digits_are_read_up_to_the_bound() -> None:
    assert ascii_int("3600", 4) == 3600
    assert ascii_int("36000", 4) is None
    assert ascii_int(None, 4) is None


@pytest.mark.parametrize("raw", UNREADABLE)
def test_an_upload_expiry_that_is_not_a_number_is_a_bad_request(raw: str) -> None:
    with pytest.raises(ApiError) as refused:
        expires_after_seconds("created_at", raw)
    assert (refused.value.status, refused.value.body.code, refused.value.body.param) == (
        400, "invalid_expires_after", "expires_after")


def test_an_upload_expiry_in_range_is_its_seconds() -> None:
    assert expires_after_seconds("created_at", "3600") == 3600


@pytest.mark.parametrize("raw", UNREADABLE)
def test_a_results_limit_or_cursor_that_is_not_a_number_is_a_bad_request(raw: str) -> None:
    with pytest.raises(ApiError) as limit:
        limit_of(raw, DEFAULT_LIMIT, MAX_LIMIT)
    with pytest.raises(ApiError) as cursor:
        _cursor(f"{raw}.0")
    with pytest.raises(ApiError) as cursor_index:
        _cursor(f"5.{raw}")
    assert [error.value.body.code for error in (limit, cursor, cursor_index)] == [
        "invalid_limit", "invalid_after", "invalid_after"]


def test_a_results_cursor_reads_its_sequence_and_lines() -> None:
    assert _cursor("42.7") == (42, 7)
    assert _cursor(None) == (0, 0)
    assert limit_of("1000", DEFAULT_LIMIT, MAX_LIMIT) == 1000
