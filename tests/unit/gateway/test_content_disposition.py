"""A download's Content-Disposition: the file's name, quoted so that no name breaks the header, the exact name in
RFC 6266's `filename*` whenever the quoted fallback is not it."""

from urllib.parse import unquote

import pytest

from services.gateway.http.disposition import content_disposition


def test_a_plain_ascii_name_is_quoted_as_it_is() -> None:
    assert content_disposition("batch_abc_output.jsonl") == 'attachment; filename="batch_abc_output.jsonl"'


@pytest.mark.parametrize("name", ['a"b.jsonl', "a\\b.jsonl", "a\r\nX-Evil: 1.jsonl", "año.jsonl", "数据.jsonl",
                                  "tab\there.jsonl"])
def test_any_other_name_has_a_safe_ascii_fallback_and_its_exact_name_in_filename_star(name: str) -> None:
    header = content_disposition(name)
    fallback, _, star = header.removeprefix('attachment; filename="').partition('"; filename*=UTF-8\'\'')
    assert header.isascii() and header.isprintable()
    assert '"' not in fallback and "\\" not in fallback
    assert unquote(star) == name and ";" not in star and " " not in star


def test_a_name_of_nothing_downloads_under_a_placeholder() -> None:
    assert content_disposition("") == 'attachment; filename="download"'
