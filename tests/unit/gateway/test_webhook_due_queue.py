"""The due webhook deliveries as a gateway keeps them: offered round robin across owners, each owner's oldest first
(owners in the order of their oldest), only once due, as last written, and never more than a few of one owner per
poll, so an owner with a backlog behind a broken endpoint never holds back another's deliveries nor costs a poll its
whole backlog."""

from services.gateway.webhooks.due_queue import LOOKED_AT_PER_ENDPOINT, LOOKED_AT_PER_OWNER, SLACK, DueQueue
from services.gateway.webhooks.store import Due

OWNERS = {"a1": "alice", "a2": "alice", "b1": "bob"}


def queue() -> DueQueue:
    return DueQueue(owner_of=lambda endpoint_id: OWNERS.get(endpoint_id, endpoint_id))


def offered_ids(due: DueQueue, now: float) -> list[str]:
    return [claim.delivery_id for claim, _ in due.offered(now)]


def test_due_deliveries_are_offered_round_robin_across_owners_each_owners_oldest_first() -> None:
    due = queue()
    for delivery_id, endpoint_id, at in (("m1", "a1", 1.0), ("m2", "a2", 2.0), ("m3", "a1", 3.0), ("m4", "b1", 4.0),
                                         ("m5", "a2", 5.0)):
        due.set(delivery_id, Due(endpoint_id=endpoint_id, not_before=at))

    assert offered_ids(due, 10.0) == ["m1", "m4", "m2", "m3", "m5"]
    assert [owner for _, owner in due.offered(10.0)] == ["alice", "bob", "alice", "alice", "alice"]
    assert offered_ids(due, 10.0) == ["m1", "m4", "m2", "m3", "m5"]  # offering takes nothing away


def test_a_delivery_is_offered_only_once_due_and_as_last_written() -> None:
    due = queue()
    due.set("m1", Due(endpoint_id="a1", not_before=5.0))
    assert offered_ids(due, 4.0) == []
    assert offered_ids(due, 5.0) == ["m1"]

    due.set("m1", Due(endpoint_id="a1", not_before=50.0))  # claimed: moved a lease ahead
    assert offered_ids(due, 10.0) == []
    assert offered_ids(due, 50.0) == ["m1"]

    due.forget("m1")  # ended
    assert offered_ids(due, 100.0) == [] and due.entries == {} and due.heaps == {}
    due.set("m1", None)
    assert due.entries == {}


def test_an_owners_backlog_costs_a_poll_a_few_of_its_deliveries_and_never_holds_back_anothers() -> None:
    due = queue()
    for n in range(1000):
        due.set(f"old-{n}", Due(endpoint_id="a1", not_before=float(n)))
    due.set("bobs", Due(endpoint_id="b1", not_before=5000.0))

    offered = offered_ids(due, 6000.0)
    assert len(offered) == LOOKED_AT_PER_ENDPOINT + 1
    assert offered[:2] == ["old-0", "bobs"]


def test_rewritten_entries_leave_no_heap_growing_without_bound() -> None:
    due = queue()
    for n in range(10 * SLACK):
        due.set("m1", Due(endpoint_id="a1", not_before=float(n)))
    assert len(due.heaps["alice"]["a1"]) <= 2 + SLACK
    assert offered_ids(due, 10.0 * SLACK) == ["m1"]


def test_an_owners_backlog_at_one_endpoint_never_holds_back_its_other_endpoints() -> None:
    """A broken endpoint's backlog (its breaker open, only one probe a cooldown) must not keep the same owner's other
    endpoints (an organisation-wide one, say) from being offered anything at all."""
    due = queue()
    for n in range(10 * LOOKED_AT_PER_OWNER):
        due.set(f"broken-{n}", Due(endpoint_id="a1", not_before=float(n)))
    due.set("healthy", Due(endpoint_id="a2", not_before=5000.0))

    offered = offered_ids(due, 6000.0)
    assert "healthy" in offered
    assert len(offered) <= 2 * LOOKED_AT_PER_OWNER
