"""What untrusted parties send that is skipped or refused is logged at most once a minute per source, cut short."""

import logging

import pytest

from services.runtime.process.skip_log import SkipLog


def test_a_flood_from_one_source_is_one_line_and_each_source_gets_its_own(caplog: pytest.LogCaptureFixture) -> None:
    skips = SkipLog(logging.getLogger("tests.skips"), "refused")
    with caplog.at_level(logging.WARNING, logger="tests.skips"):
        for _ in range(1000):
            skips.skipped("executor evil", "x" * 10_000)
        skips.skipped("executor other", "a bad advert")
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2
    assert lines[0].startswith("refused from executor evil: ") and len(lines[0]) < 400
    assert lines[1] == "refused from executor other: a bad advert"


def test_the_next_line_after_the_quiet_time_counts_what_was_left_out(caplog: pytest.LogCaptureFixture) -> None:
    skips = SkipLog(logging.getLogger("tests.skips"), quiet_s=0.0)
    skips.quiet_s = 3600.0
    with caplog.at_level(logging.WARNING, logger="tests.skips"):
        for _ in range(5):
            skips.skipped("k", "garbage")
        skips.quiet_s = 0.0
        skips.skipped("k", "garbage")
    assert [record.getMessage() for record in caplog.records] == [
        "skipped from k: garbage", "skipped from k: garbage (and 4 more skipped in the last 0s)"]
