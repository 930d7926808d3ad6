"""The operator's per-owner shares of the fleet: lines committed in the last minutes, from the batch records."""

import pytest

from contracts.api.batch import Batch, RequestCounts
from contracts.api.batch import BatchStatus as Status
from contracts.readmodel import BatchRecord
from services.gateway.usecases.shares import SHARE_WINDOW_S, owner_shares, recent_lines

NOW = 1_700_000_000.0


def record(batch_id: str, user: str | None, status: Status, done: int = 0, total: int = 100,
           began: float | None = None, stopped: float | None = None, failed: int = 0) -> BatchRecord:
    batch = Batch(id=batch_id, endpoint="/v1/chat/completions", input_file_id="file-in", completion_window="24h",
                  status=status, created_at=int(NOW - 3600),
                  in_progress_at=None if began is None else int(began),
                  finalizing_at=None if stopped is None else int(stopped),
                  completed_at=None if stopped is None or status != "completed" else int(stopped),
                  request_counts=RequestCounts(total=total, completed=done, failed=failed))
    return BatchRecord(owner_key_id=f"key-of-{user or batch_id}", owner_user_id=user, batch=batch, last_sequence=1)


def test_a_batch_that_ran_inside_the_window_counts_every_line() -> None:
    finished = record("b", "ann", "completed", done=90, failed=10, began=NOW - 120, stopped=NOW - 60).batch
    assert recent_lines(finished, NOW) == 100


def test_a_batch_that_ran_partly_before_the_window_counts_the_part_inside_at_its_pace() -> None:
    running = record("b", "ann", "in_progress", done=1000, began=NOW - 2 * SHARE_WINDOW_S).batch
    assert recent_lines(running, NOW) == pytest.approx(500)


def test_a_batch_that_stopped_before_the_window_or_never_began_counts_nothing() -> None:
    assert recent_lines(record("b", "ann", "completed", 100, 100, NOW - 900, NOW - 600).batch, NOW) == 0
    assert recent_lines(record("b", "ann", "validated").batch, NOW) == 0


def test_a_batch_that_began_and_ended_within_one_second_counts_at_that_second() -> None:
    assert recent_lines(record("b", "ann", "completed", 1, 1, NOW - 5, NOW - 5).batch, NOW) == 1


def test_each_owners_share_is_its_part_of_the_lines_committed_in_the_window() -> None:
    shares = owner_shares([
        record("a1", "ann", "in_progress", done=300, total=2000, began=NOW - SHARE_WINDOW_S),
        record("b1", "bob", "completed", done=50, total=50, began=NOW - 100, stopped=NOW - 50),
        record("b2", "bob", "in_progress", done=50, total=500, began=NOW - 60),
        record("c1", "cy", "validated", total=600),
    ], {"ann": "acme", "bob": None}, NOW)
    assert [(s.user_id, s.organization_id, s.share) for s in shares] == [
        ("ann", "acme", 0.75), ("bob", None, 0.25), ("cy", None, 0.0)]
    ann, bob, cy = shares
    assert (ann.recent_lines, ann.running_batches, ann.queued_batches, ann.lines_left) == (300, 1, 0, 1700)
    assert (bob.recent_lines, bob.running_batches, bob.lines_left) == (100, 1, 450)
    assert (cy.queued_batches, cy.lines_left, cy.owner) == (1, 600, "user-cy")


def test_owners_with_nothing_queued_running_or_recent_are_left_out() -> None:
    assert owner_shares([record("old", "ann", "completed", 10, 10, NOW - 7200, NOW - 7100),
                         record("bad", "bob", "failed", total=10)], {}, NOW) == []


def test_a_key_without_a_user_is_an_owner_of_its_own_in_no_organisation() -> None:
    [share] = owner_shares([record("k", None, "in_progress", done=10, began=NOW - 10)], {}, NOW)
    assert (share.owner, share.user_id, share.organization_id, share.share) == ("key-key-of-k", None, None, 1.0)


def test_a_cancelling_batch_still_runs_and_counts() -> None:
    [share] = owner_shares([record("c", "ann", "cancelling", done=40, began=NOW - 40)], {}, NOW)
    assert (share.running_batches, share.recent_lines) == (1, 40)
