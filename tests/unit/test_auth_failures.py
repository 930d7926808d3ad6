"""Brute force on keys: the sliding window of failed authentications per client address."""

from services.gateway.auth_failures import MAX_ADDRESSES, FailedAuthentications


def test_an_address_is_refused_after_the_limit_until_its_oldest_failure_leaves_the_window() -> None:
    failures = FailedAuthentications(limit=3, window_s=60.0)
    for at in (0.0, 10.0):
        failures.record_failure("10.0.0.1", now=at)
    assert failures.wait_s("10.0.0.1", now=11.0) == 0.0
    failures.record_failure("10.0.0.1", now=20.0)
    assert failures.wait_s("10.0.0.1", now=21.0) == 39.0
    assert failures.wait_s("10.0.0.1", now=59.9) > 0
    assert failures.wait_s("10.0.0.1", now=60.0) == 0.0


def test_failures_from_one_address_do_not_refuse_another() -> None:
    failures = FailedAuthentications(limit=1, window_s=60.0)
    failures.record_failure("10.0.0.1", now=0.0)
    assert failures.wait_s("10.0.0.1", now=1.0) > 0
    assert failures.wait_s("10.0.0.2", now=1.0) == 0.0


def test_an_address_whose_failures_all_expired_is_forgotten() -> None:
    failures = FailedAuthentications(limit=2, window_s=60.0)
    failures.record_failure("10.0.0.1", now=0.0)
    assert failures.wait_s("10.0.0.1", now=61.0) == 0.0
    assert "10.0.0.1" not in failures.failures


def test_the_number_of_tracked_addresses_is_bounded() -> None:
    failures = FailedAuthentications(limit=1, window_s=60.0)
    for n in range(MAX_ADDRESSES + 5):
        failures.record_failure(f"a{n}", now=0.0)
    assert len(failures.failures) == MAX_ADDRESSES
    assert failures.wait_s("a0", now=1.0) == 0.0 and failures.wait_s(f"a{MAX_ADDRESSES + 4}", now=1.0) > 0
