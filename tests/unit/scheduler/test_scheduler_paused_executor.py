"""An executor that pauses past its lease (SIGSTOP, a GC stall, a partition) and comes back: its old attempts
stay fenced, it gets no work while it counts as lost, and once it heartbeats again it is live and keeps new work."""

from contracts.events.batch import AttemptFailed, BatchAssigned, BatchStarted, BatchValidated
from contracts.events.executor import ExecutorLost, ExecutorRegistered
from services.scheduler.book import Book
from services.scheduler.decisions import Action, Assign, DeclareLost, FenceAttempt, Wait, decide
from services.scheduler.domain import HEARTBEAT_FRESH_MS
from tests.factories import batch_created
from tests.unit.scheduler.test_scheduler_decisions import CATALOGUE, NOW, advert, assign, validated_book

LOST_AT = NOW + HEARTBEAT_FRESH_MS + 1
BACK_AT = LOST_AT + 5_000


def act(book: Book, actions: list[Action], now_ms: int) -> None:
    """What the scheduler publishes for these actions, folded back into its book (as `Scheduler._act` does)."""
    for action in actions:
        if isinstance(action, DeclareLost):
            book.apply(ExecutorLost(aggregate_id=action.executor_id, last_heartbeat_at=action.last_heartbeat_at))
        elif isinstance(action, FenceAttempt):
            book.apply(AttemptFailed(aggregate_id=action.plan.batch_id, attempt=action.attempt,
                                     executor_id=action.executor_id, code=action.code, reason=action.reason))
        elif isinstance(action, Assign):
            book.apply(BatchAssigned(aggregate_id=action.plan.batch_id, executor_id=action.executor_id,
                                     attempt=action.attempt, lease_token="t", occurred_at=now_ms))


def new_batch(book: Book, batch: str) -> None:
    book.apply(batch_created(batch, "k", "files/f", created_at=0, expires_at=NOW // 1000 + 3600))
    book.apply(BatchValidated(aggregate_id=batch, total_lines=3, model="m"))


def paused_book() -> Book:
    """e1 ran b1 and went silent past its lease: declared lost, b1's attempt fenced; the only executor."""
    book = validated_book()
    book.admitted, book.known_executors = {"e1"}, {"e1": NOW}
    assign(book, "e1", 1)
    actions = decide(book, [], CATALOGUE, LOST_AT)
    assert [(type(a), getattr(a, "code", None)) for a in actions] == [(DeclareLost, None),
                                                                      (FenceAttempt, "executor_lost")]
    act(book, actions, LOST_AT)
    return book


def summary(actions: list[Action]) -> list[tuple[str, str, str | None, int | None]]:
    return [(type(a).__name__, a.plan.batch_id if not isinstance(a, DeclareLost) else "",
             getattr(a, "executor_id", None), getattr(a, "attempt", None)) for a in actions]


def test_an_executor_declared_lost_gets_no_work_while_only_its_stale_advert_is_seen() -> None:
    book = paused_book()
    new_batch(book, "b2")
    stale = advert("e1", heartbeat_at=NOW)  # the last advert before the pause, still in a scan
    book.note_heartbeats([stale])
    actions = decide(book, [stale], CATALOGUE, LOST_AT + 1000)
    assert not [a for a in actions if isinstance(a, Assign)]
    assert {type(a) for a in actions} <= {Wait}


def test_a_beat_sent_just_before_the_pause_that_lands_after_it_neither_revives_nor_loses_it_again() -> None:
    book = paused_book()
    new_batch(book, "b2")
    late = advert("e1", heartbeat_at=NOW + 3_000)  # put before the SIGSTOP, stored after the SIGCONT
    book.note_heartbeats([late])
    actions = decide(book, [late], CATALOGUE, LOST_AT + 2_000)
    assert not [a for a in actions if isinstance(a, Assign | DeclareLost)]


def test_a_fresh_advert_is_not_enough_to_give_work_to_an_executor_the_book_counts_lost() -> None:
    book = paused_book()
    new_batch(book, "b2")
    # Before the scheduler notes the heartbeat it must not assign by the advert alone (and fence it a tick later).
    assert not [a for a in decide(book, [advert("e1", heartbeat_at=BACK_AT)], CATALOGUE, BACK_AT)
                if isinstance(a, Assign)]


def test_a_paused_executor_that_heartbeats_again_is_live_and_keeps_the_work_it_is_given() -> None:
    book = paused_book()
    new_batch(book, "b2")
    back = [advert("e1", heartbeat_at=BACK_AT)]
    book.note_heartbeats(back)
    assigned = decide(book, back, CATALOGUE, BACK_AT)
    assert summary(assigned) == [("Assign", "b1", "e1", 2), ("Assign", "b2", "e1", 1)]
    act(book, assigned, BACK_AT)
    for beat in range(1, 6):  # it keeps heartbeating: nothing is fenced, nothing declared lost
        now = BACK_AT + beat * 3_000
        book.note_heartbeats([advert("e1", heartbeat_at=now)])
        assert decide(book, [advert("e1", heartbeat_at=now)], CATALOGUE, now) == []


def test_the_lost_fact_read_again_after_the_executor_came_back_does_not_lose_it_again() -> None:
    book = paused_book()
    book.note_heartbeats([advert("e1", heartbeat_at=BACK_AT)])
    book.apply(ExecutorLost(aggregate_id="e1", last_heartbeat_at=NOW))  # the log delivers our own fact
    assert book.last_heard([]) == {"e1": BACK_AT}


def test_a_paused_executor_that_registers_again_starts_a_new_epoch_fencing_only_older_attempts() -> None:
    book = paused_book()
    book.apply(ExecutorRegistered(aggregate_id="e1", advert=advert("e1", heartbeat_at=BACK_AT), started_at=BACK_AT,
                                  worker_key_id="key_w", occurred_at=BACK_AT))
    new_batch(book, "b2")
    assigned = decide(book, [advert("e1", heartbeat_at=BACK_AT)], CATALOGUE, BACK_AT + 1)
    assert summary(assigned) == [("Assign", "b1", "e1", 2), ("Assign", "b2", "e1", 1)]
    act(book, assigned, BACK_AT + 1)  # work of the new epoch: assigned after it registered again, not fenced
    assert decide(book, [advert("e1", heartbeat_at=BACK_AT + 3_000)], CATALOGUE, BACK_AT + 3_000) == []


def test_a_standby_folding_the_log_counts_the_returned_executor_live_once_it_heartbeats() -> None:
    standby = Book()
    standby.apply(ExecutorRegistered(aggregate_id="e1", advert=advert("e1"), started_at=NOW, worker_key_id="key_w",
                                       occurred_at=NOW))
    standby.apply(ExecutorLost(aggregate_id="e1", last_heartbeat_at=NOW))
    new_batch(standby, "b2")
    assert not [a for a in decide(standby, [advert("e1", heartbeat_at=BACK_AT)], CATALOGUE, BACK_AT)
                if isinstance(a, Assign)]
    standby.note_heartbeats([advert("e1", heartbeat_at=BACK_AT)])
    assert summary(decide(standby, [advert("e1", heartbeat_at=BACK_AT)], CATALOGUE, BACK_AT)) == [
        ("Assign", "b2", "e1", 1)]


def fence(book: Book, attempt: int, code: str, batch: str = "b1") -> None:
    book.apply(AttemptFailed(aggregate_id=batch, attempt=attempt, executor_id="e1", code=code, reason="x"))


def test_attempts_queued_on_an_executor_lost_or_restarted_before_they_started_do_not_exhaust_the_batch() -> None:
    book = validated_book()
    for attempt, code in ((1, "executor_lost"), (2, "executor_restarted"), (3, "executor_restarted")):
        assign(book, "e1", attempt)
        fence(book, attempt, code)
    assert summary(decide(book, [advert("e1")], CATALOGUE, NOW)) == [("Assign", "b1", "e1", 4)]


def started_then_restarted(book: Book, attempt: int, started_at: int, restarted_at: int) -> None:
    assign(book, "e1", attempt)
    book.apply(BatchStarted(aggregate_id="b1", attempt=attempt, executor_id="e1", engine="llamacpp",
                            engine_version="1", occurred_at=started_at))
    book.apply(ExecutorRegistered(aggregate_id="e1", advert=advert("e1", heartbeat_at=restarted_at),
                                  started_at=restarted_at, worker_key_id="key_w", occurred_at=restarted_at))
    fence(book, attempt, "executor_restarted")


def test_attempts_that_started_and_died_with_their_executor_still_count() -> None:
    book = validated_book()
    for attempt in (1, 2, 3):
        started_then_restarted(book, attempt, started_at=NOW + attempt * 1000, restarted_at=NOW + attempt * 1000 + 500)
    assert book.plans["b1"].shard(0).strikes == 3
    assert not [a for a in decide(book, [advert("e1")], CATALOGUE, NOW + 5000) if isinstance(a, Assign)]


def test_an_attempt_the_restarted_process_picked_up_before_it_was_fenced_does_not_count() -> None:
    book = validated_book()
    for attempt in (1, 2, 3):  # the new process takes the redelivered command, then the restart fences it
        started_then_restarted(book, attempt, started_at=NOW + attempt * 1000 + 700, restarted_at=NOW + attempt * 1000)
    assert book.plans["b1"].shard(0).strikes == 0


def test_a_shard_that_never_gets_to_start_still_fails_in_the_end() -> None:
    book = validated_book()
    for attempt in range(1, 10):
        assign(book, "e1", attempt)
        fence(book, attempt, "executor_restarted")
    assert book.plans["b1"].shard(0).strikes == 3


def test_a_new_term_gives_every_executor_an_adverts_lifetime_to_be_heard_before_any_is_lost() -> None:
    """Adverts reach the bucket through a scheduler: after every scheduler was down longer than an advert lasts, the
    next term finds none, and must not fence work only because nobody could write its heartbeat meanwhile."""
    book = validated_book()
    book.admitted, book.known_executors = {"e1"}, {"e1": NOW}
    assign(book, "e1", 1)
    started = LOST_AT + 60_000  # a minute of silence: the whole control plane was down
    assert not [a for a in decide(book, [], CATALOGUE, started, listening_since_ms=started)
                if isinstance(a, DeclareLost | FenceAttempt)]
    assert not [a for a in decide(book, [], CATALOGUE, started + HEARTBEAT_FRESH_MS, listening_since_ms=started)
                if isinstance(a, DeclareLost | FenceAttempt)]
    late = decide(book, [], CATALOGUE, started + HEARTBEAT_FRESH_MS + 1, listening_since_ms=started)
    assert [(type(a), getattr(a, "code", None)) for a in late] == [(DeclareLost, None), (FenceAttempt, "executor_lost")]
