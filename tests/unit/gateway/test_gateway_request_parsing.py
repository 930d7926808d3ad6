"""What the gateway accepts in headers and query strings before any backend is asked: strict, ASCII, bounded."""

import pytest
from aiohttp.test_utils import make_mocked_request

from contracts.api.model import Model
from services.gateway.http.paging import MAX_FILES_LIMIT, page_after, parse_limit
from services.gateway.usecases.batches import completion_window_seconds
from services.gateway.usecases.refusals import ApiError
from services.gateway.views.events import MAX_SEQUENCE, resume_after

HOUR = 3600


@pytest.mark.parametrize("raw", ["18446744073709551617", str(MAX_SEQUENCE + 1), "-3", "12a", "\u0661\u0662",
                                 "9" * 5000])
def test_a_last_event_id_that_names_no_stream_sequence_is_a_400(raw: str) -> None:
    with pytest.raises(ApiError) as refused:
        resume_after(make_mocked_request("GET", "/", headers={"Last-Event-ID": raw}))
    assert (refused.value.status, refused.value.body.code) == (400, "invalid_last_event_id")


@pytest.mark.parametrize(("raw", "after"), [("0", 0), (" 17 ", 17), (str(MAX_SEQUENCE), MAX_SEQUENCE)])
def test_a_last_event_id_in_range_is_the_resume_point(raw: str, after: int) -> None:
    assert resume_after(make_mocked_request("GET", "/", headers={"Last-Event-ID": raw})) == after


@pytest.mark.parametrize("window", ["\uff12\uff14h", "\u00b2h", "\u0662\u0664h", "24", "h", "1" * 5000 + "h",
                                    "169h", 24])
def test_a_completion_window_not_written_in_ascii_digits_within_range_is_refused(window: object) -> None:
    with pytest.raises(ApiError) as refused:
        completion_window_seconds(window, 24 * HOUR)
    assert refused.value.body.code == "invalid_completion_window"


def test_completion_windows_from_24h_to_168h_are_accepted() -> None:
    assert completion_window_seconds("24h", 24 * HOUR) == 24 * HOUR
    assert completion_window_seconds("168h", 24 * HOUR) == 168 * HOUR


@pytest.mark.parametrize("query", ["limit=0", "limit=101", "limit=ten", "limit=%D9%A1", "limit=" + "9" * 5000])
def test_a_limit_outside_1_to_100_is_a_400(query: str) -> None:
    with pytest.raises(ApiError) as refused:
        parse_limit(make_mocked_request("GET", f"/?{query}"))
    assert (refused.value.status, refused.value.body.code) == (400, "invalid_limit")


def test_a_list_with_a_higher_maximum_takes_limits_up_to_it() -> None:
    assert parse_limit(make_mocked_request("GET", "/?limit=10000"), MAX_FILES_LIMIT, MAX_FILES_LIMIT) == 10_000
    assert parse_limit(make_mocked_request("GET", "/"), MAX_FILES_LIMIT, MAX_FILES_LIMIT) == 10_000
    with pytest.raises(ApiError):
        parse_limit(make_mocked_request("GET", "/?limit=10001"), MAX_FILES_LIMIT, MAX_FILES_LIMIT)


MODELS = [Model(id=f"m{n}", created=n, owned_by="sheshnag") for n in range(5)]
IDS = [m.id for m in MODELS]


def test_paging_after_an_id_continues_right_after_it() -> None:
    page = page_after(MODELS, IDS, "m1", 2)
    assert ([m.id for m in page.data], page.has_more) == (["m2", "m3"], True)
    assert [m.id for m in page_after(MODELS, IDS, "m4", 2).data] == []


def test_paging_after_an_id_not_in_the_list_is_a_400_not_the_first_page() -> None:
    with pytest.raises(ApiError) as refused:
        page_after(MODELS, IDS, "m-unknown", 2)
    assert (refused.value.status, refused.value.body.code, refused.value.body.param) == (400, "invalid_after",
                                                                                         "after")
