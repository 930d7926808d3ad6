"""Brute force on keys: guesses from an address are refused a while, right keys never for others' failures."""

import secrets

from services.gateway.http.auth_failures import (
    IDENTITY_LIMIT,
    MAX_ENTRIES,
    FailedAuthentications,
    identity,
    unguessable,
)

ADDRESS = "10.0.0.1"
WEAK_ADMIN = "gk-e2e-test-key"


def generated() -> str:
    return f"gk-{secrets.token_urlsafe(32)}"


def guess() -> str:
    return f"pw-{secrets.token_hex(4)}"


def over_budget(limit: int = 3, window_s: float = 60.0) -> FailedAuthentications:
    failures = FailedAuthentications(limit=limit, window_s=window_s)
    for _ in range(limit):
        failures.record_failure(ADDRESS, guess(), now=0.0)
    return failures


def test_only_keys_of_the_generated_shape_and_randomness_count_as_unguessable() -> None:
    assert unguessable(generated()) and unguessable(f"wk-{secrets.token_urlsafe(32)}")
    assert not unguessable(WEAK_ADMIN)
    assert not unguessable("gk-" + "a" * 43)  # the shape, chosen by hand
    assert not unguessable(generated()[:40])


def test_an_address_is_over_budget_after_the_limit_until_its_oldest_failure_leaves_the_window() -> None:
    failures = FailedAuthentications(limit=3, window_s=60.0)
    for at in (0.0, 10.0):
        assert failures.record_failure(ADDRESS, guess(), now=at) == 0.0
    assert failures.record_failure(ADDRESS, guess(), now=20.0) == 40.0
    assert failures.refusal_s(ADDRESS, guess(), now=21.0) == 39.0
    assert failures.refusal_s(ADDRESS, guess(), now=59.9) > 0
    assert failures.refusal_s(ADDRESS, guess(), now=60.0) == 0.0


def test_a_generated_key_is_always_looked_up_whatever_its_address_guessed() -> None:
    failures = over_budget()
    assert failures.refusal_s(ADDRESS, generated(), now=1.0) == 0.0


def test_a_wrong_generated_key_past_the_budget_is_told_to_wait() -> None:
    failures = over_budget()
    assert failures.record_failure(ADDRESS, generated(), now=1.0) > 0


def test_a_guessable_key_not_used_from_the_address_is_refused_unlooked_while_it_is_over_budget() -> None:
    failures = over_budget()
    assert failures.refusal_s(ADDRESS, WEAK_ADMIN, now=1.0) > 0
    assert failures.refusal_s(ADDRESS, guess(), now=1.0) > 0


def test_a_guessable_key_that_succeeded_from_the_address_before_keeps_being_looked_up() -> None:
    failures = FailedAuthentications(limit=3, window_s=60.0)
    failures.record_success(ADDRESS, WEAK_ADMIN, now=0.0)
    for _ in range(100):
        failures.record_failure(ADDRESS, guess(), now=1.0)
    assert failures.refusal_s(ADDRESS, WEAK_ADMIN, now=2.0) == 0.0


def test_guesses_at_the_second_half_of_a_key_in_use_get_a_few_tries_a_window() -> None:
    failures = FailedAuthentications(limit=3, window_s=60.0)
    failures.record_success(ADDRESS, WEAK_ADMIN, now=0.0)
    near = WEAK_ADMIN[:len(WEAK_ADMIN) // 2] + "x" * (len(WEAK_ADMIN) - len(WEAK_ADMIN) // 2)
    for n in range(IDENTITY_LIMIT):
        assert failures.refusal_s(ADDRESS, near, now=1.0 + n) == 0.0
        failures.record_failure(ADDRESS, near, now=1.0 + n)
    assert failures.refusal_s(ADDRESS, near, now=20.0) > 0
    assert failures.refusal_s(ADDRESS, WEAK_ADMIN, now=20.0) > 0  # its tries are spent for this window too
    assert failures.refusal_s(ADDRESS, WEAK_ADMIN, now=61.0 + IDENTITY_LIMIT) == 0.0


def test_trust_is_per_address() -> None:
    failures = over_budget()
    failures.record_success("10.0.0.2", WEAK_ADMIN, now=0.0)
    assert failures.refusal_s(ADDRESS, WEAK_ADMIN, now=1.0) > 0


def test_failures_from_one_address_do_not_refuse_another() -> None:
    failures = over_budget(limit=1)
    assert failures.refusal_s(ADDRESS, guess(), now=1.0) > 0
    assert failures.refusal_s("10.0.0.2", guess(), now=1.0) == 0.0


def test_an_address_whose_failures_all_expired_is_forgotten() -> None:
    failures = FailedAuthentications(limit=2, window_s=60.0)
    failures.record_failure(ADDRESS, guess(), now=0.0)
    assert failures.wait_s(ADDRESS, now=61.0) == 0.0
    assert ADDRESS not in failures.failures


def test_every_table_is_bounded() -> None:
    failures = FailedAuthentications(limit=1, window_s=60.0)
    for n in range(MAX_ENTRIES + 5):
        failures.record_failure(f"a{n}", "pw", now=0.0)
        failures.record_success(f"a{n}", "pw", now=0.0)
    assert len(failures.failures) == len(failures.identity_failures) == len(failures.trusted) == MAX_ENTRIES
    assert failures.wait_s("a0", now=1.0) == 0.0 and failures.wait_s(f"a{MAX_ENTRIES + 4}", now=1.0) > 0


def test_a_key_with_bytes_that_are_not_utf8_has_an_identity_like_any_other() -> None:
    garbled = "gk-\udcff" + "a" * 40  # how aiohttp hands on a header byte 0xff
    assert identity("10.0.0.1", garbled) != identity("10.0.0.1", "gk-" + "a" * 41)
