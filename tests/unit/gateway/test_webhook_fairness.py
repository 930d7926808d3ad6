"""Fair webhook delivery, without I/O: limits per owner and per endpoint, and a breaker
per endpoint that defers its deliveries after consecutive failures and lets one probe through after a cooldown."""

from services.gateway.webhooks.fairness import Fairness


def fairness() -> Fairness:
    return Fairness(owner_limit=2, endpoint_limit=1, breaker_failures=3, cooldown_s=10.0)


def test_an_owner_and_an_endpoint_get_no_more_than_their_limits_at_once() -> None:
    fair = fairness()
    fair.started("a1", "alice")
    assert not fair.may_start("a1", "alice", 0.0)  # the endpoint's one slot
    fair.started("a2", "alice")
    assert not fair.may_start("a3", "alice", 0.0)  # the owner's two
    assert fair.may_start("b1", "bob", 0.0)
    fair.ended("a1", "alice", True, 0.0)
    assert fair.may_start("a1", "alice", 0.0) and fair.may_start("a3", "alice", 0.0)


def test_a_failing_endpoint_is_deferred_until_one_probe_after_the_cooldown_decides() -> None:
    fair = fairness()
    for now in (1.0, 2.0, 3.0):
        fair.started("a1", "alice")
        fair.ended("a1", "alice", False, now)
    assert not fair.may_start("a1", "alice", 12.9)  # open: deferred for the cooldown
    assert fair.may_start("a1", "alice", 13.0)  # half-open: one probe
    fair.started("a1", "alice")
    fair.ended("a1", "alice", False, 14.0)
    assert not fair.may_start("a1", "alice", 23.9)  # the probe failed: open again
    fair.started("a1", "alice")
    fair.ended("a1", "alice", True, 24.0)
    assert fair.may_start("a1", "alice", 24.0) and not fair.is_open("a1")


def test_an_attempt_that_says_nothing_of_the_endpoint_neither_opens_nor_closes_its_breaker() -> None:
    fair = fairness()
    for _ in range(2):
        fair.started("a1", "alice")
        fair.ended("a1", "alice", False, 0.0)
    fair.started("a1", "alice")
    fair.ended("a1", "alice", None, 0.0)  # the endpoint was deleted: no attempt reached it
    assert not fair.is_open("a1")
    fair.started("a1", "alice")
    fair.ended("a1", "alice", False, 0.0)
    assert fair.is_open("a1")
