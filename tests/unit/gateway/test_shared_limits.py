"""The window and bucket arithmetic every gateway applies to the shared counts: the same answers whichever gateway
wrote them, in whatever order, whatever its clock says."""

import math
from typing import Never

from services.gateway.adapters.shared_state import MAX_TTL_S, SharedState, SharedStateUnavailable, key_of, ttl_of
from services.gateway.http.auth_failures import IDENTITY_LIMIT, TRUST_S, recent, refusal, wait_of, with_failure
from services.gateway.http.limits import ControlCallLimiter, spend


def test_failures_written_out_of_order_by_two_gateways_are_read_oldest_first() -> None:
    times = with_failure([10.0, 30.0], now=20.0, window_s=60.0, limit=5)  # a gateway whose clock is behind
    assert times == [10.0, 20.0, 30.0]


def test_only_the_latest_failures_within_the_window_are_kept() -> None:
    times = [0.0, 1.0, 2.0, 3.0, 4.0]
    assert recent(times, now=61.5, window_s=60.0, limit=10) == [2.0, 3.0, 4.0]
    assert recent(times, now=5.0, window_s=60.0, limit=2) == [3.0, 4.0]
    assert with_failure(times, now=5.0, window_s=60.0, limit=3) == [3.0, 4.0, 5.0]


def test_an_address_waits_until_the_oldest_of_its_last_limit_failures_leaves_the_window() -> None:
    assert wait_of([0.0, 10.0], now=20.0, window_s=60.0, limit=3) == 0.0
    assert wait_of([0.0, 10.0, 20.0], now=20.0, window_s=60.0, limit=3) == 40.0
    assert wait_of([0.0, 10.0, 20.0, 30.0], now=30.0, window_s=60.0, limit=3) == 40.0  # 10 is the oldest of 3
    assert wait_of([0.0, 10.0, 20.0], now=60.0, window_s=60.0, limit=3) == 0.0


def test_a_gateway_with_a_lower_limit_reads_a_list_kept_by_one_with_a_higher_alike() -> None:
    kept_by_high = [float(t) for t in range(100)]
    assert wait_of(kept_by_high, now=100.0, window_s=60.0, limit=4) == wait_of(kept_by_high[-4:], 100.0, 60.0, 4)


def test_a_guessable_key_waits_the_address_out_unless_it_succeeded_there_and_has_tries_left() -> None:
    assert refusal(0.0, None, [], now=5.0, window_s=60.0) == 0.0
    assert refusal(30.0, None, [], now=5.0, window_s=60.0) == 30.0
    assert refusal(30.0, 0.0, [], now=5.0, window_s=60.0) == 0.0
    assert refusal(30.0, 0.0, [1.0] * IDENTITY_LIMIT, now=5.0, window_s=60.0) == 56.0
    assert refusal(30.0, 0.0, [], now=TRUST_S, window_s=60.0) == 30.0  # trust ran out


def test_a_bucket_never_seen_is_full() -> None:
    bucket, wait = spend(None, now=100.0, rate_per_s=1.0, burst=3)
    assert (bucket, wait) == ([2.0, 100.0], 0.0)


def test_a_spent_bucket_says_how_long_until_its_next_token_and_refills_at_its_rate() -> None:
    bucket: list[float] | None = None
    for _ in range(3):
        bucket, wait = spend(bucket, now=0.0, rate_per_s=0.5, burst=3)
        assert wait == 0.0
    refused, wait = spend(bucket, now=1.0, rate_per_s=0.5, burst=3)
    assert wait == 1.0 and refused == [0.5, 1.0]
    assert spend(refused, now=2.0, rate_per_s=0.5, burst=3)[1] == 0.0
    assert spend([0.0, 0.0], now=1e9, rate_per_s=0.5, burst=3)[0] == [2.0, 1e9]  # never above the burst


def test_a_gateway_whose_clock_is_behind_adds_no_tokens_and_does_not_move_the_bucket_back() -> None:
    bucket, wait = spend([0.2, 50.0], now=40.0, rate_per_s=1.0, burst=3)
    assert bucket == [0.2, 50.0] and wait == 0.8


def test_a_bucket_that_never_refills_refuses_for_ever() -> None:
    assert spend([0.0, 0.0], now=5.0, rate_per_s=0.0, burst=3)[1] == math.inf


def test_keys_are_valid_for_any_address_apart_per_settings_and_entries_live_a_second_to_a_day() -> None:
    assert key_of("auth", "::ffff:10.0.0.1%eth0").replace(".", "").isalnum()
    assert key_of("auth", "10.0.0.1") != key_of("auth", "10.0.0.2") != key_of("calls", "10.0.0.1")
    assert key_of("auth", "10.0.0.1", 100, 60.0) == key_of("auth", "10.0.0.1", 100, 60.0)
    assert key_of("auth", "10.0.0.1", 100, 60.0) != key_of("auth", "10.0.0.1", 4, 60.0)
    assert ttl_of(0.2) == 2.0 and ttl_of(60.0) == 61.0 and ttl_of(1e9) == MAX_TTL_S


async def test_a_gateways_own_buckets_keep_the_spent_ones_and_forget_those_full_again() -> None:
    limiter = ControlCallLimiter(Unreachable(), rate_per_s=1.0, burst=2, forget_at=3)
    for owner, at in (("a", 0.0), ("b", 0.0), ("c", 9.5)):
        assert await limiter.wait_s(owner, now=at) == 0.0
    assert set(limiter.buckets) == {"a", "b", "c"}
    assert await limiter.wait_s("d", now=10.0) == 0.0  # a and b filled again by then; c has not
    assert set(limiter.buckets) == {"c", "d"}
    assert await limiter.wait_s("d", now=10.0) == 0.0 and await limiter.wait_s("d", now=10.0) > 0


class Unreachable(SharedState):
    """Shared counts whose broker never answers: the limiter decides from its own buckets."""

    def __init__(self) -> None:
        pass

    async def change(self, key: str, step: object, ttl_s: float) -> Never:
        raise SharedStateUnavailable("stalled", first=False)

    def fell_back(self, what: str, error: SharedStateUnavailable) -> None:
        pass
