"""The scheduler's decisions: assign, wait with a reason, retry elsewhere, fail after 3, cancel, expire."""

from types import SimpleNamespace
from typing import cast

from contracts.api.batch import BatchUsage
from contracts.catalogue import Catalogue, CatalogueModel
from contracts.events.batch import (
    AttemptFailed,
    BatchAssigned,
    BatchCancelRequested,
    BatchCompleted,
    BatchFinalizing,
    BatchValidated,
)
from contracts.events.executor import DeviceMemory, ExecutorAdvert, ExecutorRegistered
from contracts.events.key import KeyRevoked
from services.scheduler.book import CONTROL_PLANE, Book
from services.scheduler.decisions import (
    CANCEL_GRACE_MS,
    Assign,
    DeclareLost,
    FenceAttempt,
    Finalize,
    StopRevoked,
    Wait,
    decide,
)
from services.scheduler.domain import HEARTBEAT_FRESH_MS
from services.scheduler.plans import BatchPlan
from services.scheduler.term import Term
from tests.factories import batch_created

NOW = 2_000_000_000_000
MODEL = CatalogueModel(id="m", engine="llamacpp", artifact="/m.gguf", context_length=2048, memory_bytes=1000,
                       endpoints=["/v1/chat/completions"])
CATALOGUE = Catalogue(models=[MODEL])


def advert(executor_id: str, free: int = 10_000, heartbeat_at: int = NOW, parallel: int = 8) -> ExecutorAdvert:
    return ExecutorAdvert(executor_id=executor_id, engine="llamacpp", engine_version="1", models=["m"],
                          loaded_models=["m"], slots=8, heartbeat_at=heartbeat_at, parallel_attempts=parallel,
                          devices=[DeviceMemory(name="cpu", total_bytes=free, free_bytes=free)])


def validated_book(batch: str = "b1", expires_at: int = NOW // 1000 + 3600) -> Book:
    book = Book(admitted={"e1", "e2", "e3", "e4"}, known_executors=dict.fromkeys(("e1", "e2", "e3", "e4"), NOW))
    book.apply(batch_created(batch, "k", "files/f", created_at=0, expires_at=expires_at))
    book.apply(BatchValidated(aggregate_id=batch, total_lines=3, model="m"))
    return book


def assign(book: Book, executor_id: str, attempt: int, batch: str = "b1") -> None:
    book.apply(BatchAssigned(aggregate_id=batch, executor_id=executor_id, attempt=attempt, lease_token="t",
                             occurred_at=NOW))


def test_a_validated_batch_goes_to_a_live_executor_as_attempt_1() -> None:
    actions = decide(validated_book(), [advert("e1")], CATALOGUE, NOW)
    assert actions == [Assign(actions[0].plan, "e1", 1)]  # type: ignore[union-attr]


def test_a_batch_nobody_can_serve_waits_and_says_why_once() -> None:
    book = validated_book()
    actions = decide(book, [], CATALOGUE, NOW)
    assert [type(a) for a in actions] == [Wait] and actions[0].reason == "No executor is online."  # type: ignore[union-attr]
    book.plans["b1"].waiting_reason = "No executor is online."
    assert decide(book, [], CATALOGUE, NOW) == []


def test_a_lost_executor_fences_its_attempt_and_the_retry_prefers_another_executor() -> None:
    book = validated_book()
    assign(book, "e1", 1)
    assert decide(book, [advert("e2")], CATALOGUE, NOW + 1000) == [], "one scan missing its advert is no loss"
    later = NOW + HEARTBEAT_FRESH_MS + 1
    fence = [a for a in decide(book, [advert("e2", heartbeat_at=later)], CATALOGUE, later)
             if not isinstance(a, DeclareLost)]
    assert [(type(a), getattr(a, "code", None)) for a in fence] == [(FenceAttempt, "executor_lost")]
    book.apply(AttemptFailed(aggregate_id="b1", attempt=1, executor_id="e1", code="executor_lost", reason="x"))
    retry = decide(book, [advert("e1"), advert("e2")], CATALOGUE, NOW)
    assert [(type(a), getattr(a, "executor_id", None), getattr(a, "attempt", None)) for a in retry] == [
        (Assign, "e2", 2)]


def test_after_three_failed_attempts_the_batch_is_finalized_as_failed_with_the_reason_once() -> None:
    book = validated_book()
    for attempt in (1, 2, 3):
        assign(book, f"e{attempt}", attempt)
        book.apply(AttemptFailed(aggregate_id="b1", attempt=attempt, executor_id=f"e{attempt}", code="engine_crashed",
                                 reason="x"))
    [finalize] = decide(book, [advert("e4")], CATALOGUE, NOW)
    # Finalized, not failed outright: the lines it committed are still delivered.
    assert isinstance(finalize, Finalize) and finalize.reason == "failed"
    assert finalize.failure_code == "attempts_exhausted"
    assert finalize.failure_message and "e1, e2, e3" in finalize.failure_message
    assert finalize.executor_id is None  # e4 never ran it, and the executors that did failed: the control plane ends it
    finalize.plan.finalizer = CONTROL_PLANE
    assert decide(book, [advert("e4")], CATALOGUE, NOW) == []


def test_a_cancel_before_assignment_is_finalized_at_once() -> None:
    book = validated_book()
    book.apply(BatchCancelRequested(aggregate_id="b1", requested_by_key_id="k", occurred_at=NOW))
    actions = decide(book, [advert("e1")], CATALOGUE, NOW)
    assert [(type(a), getattr(a, "reason", None)) for a in actions] == [(Finalize, "cancelled")]


def test_a_running_batch_gets_a_grace_period_to_stop_on_cancel_then_is_fenced_and_finalized() -> None:
    book = validated_book()
    assign(book, "e1", 1)
    book.apply(BatchCancelRequested(aggregate_id="b1", requested_by_key_id="k", occurred_at=NOW))
    assert decide(book, [advert("e1")], CATALOGUE, NOW + 1000) == []
    late = decide(book, [advert("e1", heartbeat_at=NOW + CANCEL_GRACE_MS)], CATALOGUE, NOW + CANCEL_GRACE_MS + 1)
    assert [type(a) for a in late if not isinstance(a, DeclareLost)] == [FenceAttempt, Finalize]


def test_an_expired_batch_is_fenced_if_running_and_finalized_as_expired() -> None:
    book = validated_book(expires_at=NOW // 1000 - 1)
    assign(book, "e1", 1)
    actions = decide(book, [advert("e1")], CATALOGUE, NOW)
    assert [(type(a), getattr(a, "code", getattr(a, "reason", None))) for a in actions] == [
        (FenceAttempt, "batch_expired"), (Finalize, "expired")]


def test_an_accepted_cancel_ends_cancelled_even_once_the_window_has_passed() -> None:
    book = validated_book(expires_at=NOW // 1000 - 1)
    book.apply(BatchCancelRequested(aggregate_id="b1", requested_by_key_id="k", occurred_at=NOW - 2000))
    actions = decide(book, [advert("e1")], CATALOGUE, NOW)
    assert [(type(a), getattr(a, "reason", None)) for a in actions] == [(Finalize, "cancelled")]


def test_ended_batches_are_left_alone_and_silent_executors_are_declared_lost() -> None:
    book = validated_book()
    book.apply(BatchCompleted(aggregate_id="b1", output_file_id=None, error_file_id=None, completed=3, failed=0,
                              usage=BatchUsage()))
    book.apply(ExecutorRegistered(aggregate_id="e9", advert=advert("e9", heartbeat_at=NOW - 60_000),
                                  started_at=NOW - 60_000, worker_key_id="key_w",
                                  occurred_at=NOW - 60_000))
    assert decide(book, [], CATALOGUE, NOW) == [DeclareLost("e9", NOW - 60_000)]


def test_executors_that_never_registered_with_a_worker_key_get_no_work() -> None:
    book = validated_book()
    book.admitted.clear()
    assert [type(a) for a in decide(book, [advert("e1")], CATALOGUE, NOW)] == [Wait]


def test_a_just_registered_executor_is_not_lost_before_its_first_heartbeat_is_due() -> None:
    book = validated_book()
    book.apply(ExecutorRegistered(aggregate_id="e5", advert=advert("e5"), started_at=NOW, worker_key_id="key_w",
                                  occurred_at=NOW))
    assert not [a for a in decide(book, [], CATALOGUE, NOW + 1000) if isinstance(a, DeclareLost)]


def test_work_assigned_before_an_executor_restarted_is_fenced_and_retried() -> None:
    book = validated_book()
    assign(book, "e1", 1)
    book.apply(ExecutorRegistered(aggregate_id="e1", advert=advert("e1"), started_at=NOW + 500, worker_key_id="k",
                                  occurred_at=NOW + 500))
    actions = decide(book, [advert("e1")], CATALOGUE, NOW + 1000)
    assert [(type(a), getattr(a, "code", None)) for a in actions] == [(FenceAttempt, "executor_restarted")]


def test_a_held_batch_is_never_assigned_until_released() -> None:
    from contracts.events.batch import BatchReleased

    book = validated_book()
    book.plans["b1"].held = True
    assert decide(book, [advert("e1")], CATALOGUE, NOW) == []
    book.apply(BatchReleased(aggregate_id="b1", released_by_key_id="k"))
    assert [type(a) for a in decide(book, [advert("e1")], CATALOGUE, NOW)] == [Assign]


def registered(started_at: int, protocol: int) -> ExecutorRegistered:
    """e1's registration by a process started at `started_at` that takes commands in `protocol`."""
    return ExecutorRegistered(aggregate_id="e1", advert=advert("e1").model_copy(update={"protocol": protocol}),
                              started_at=started_at, worker_key_id="k", occurred_at=started_at)


def test_the_book_knows_the_command_protocol_of_each_executors_current_process() -> None:
    book = Book()

    book.apply(registered(NOW - 10_000, 1))
    assert book.protocols == {"e1": 1}
    book.apply(registered(NOW, 2))  # upgraded
    book.apply(registered(NOW - 10_000, 1))  # the old process's fact, read again
    assert book.protocols == {"e1": 2}
    book.apply(registered(NOW + 1_000, 1))  # downgraded
    assert book.protocols == {"e1": 1}


def test_an_executor_gone_back_to_an_older_protocol_is_no_longer_counted_on_to_finalize() -> None:
    book = validated_book()

    book.apply(registered(NOW - 10_000, 2))
    book.plans["b1"].finalizer = "e1"  # sent a finalize command in protocol 2's shape, which 1 cannot read
    book.apply(registered(NOW - 5_000, 2))  # restarted, same protocol: the command waits for it on its durable
    assert book.plans["b1"].finalizer == "e1"
    book.apply(registered(NOW, 1))  # downgraded
    assert book.plans["b1"].finalizer is None


async def test_a_new_leader_resends_every_run_though_the_fold_ends_and_opens_batches_between_sends() -> None:
    book = validated_book("b1")
    book.apply(batch_created("b2", "k", "files/f", created_at=0, expires_at=NOW // 1000 + 3600))
    book.apply(BatchValidated(aggregate_id="b2", total_lines=3, model="m"))
    assign(book, "e1", 1, "b1")
    assign(book, "e2", 1, "b2")
    sent: list[tuple[str, str]] = []

    async def send_run(plan: BatchPlan, executor_id: str, attempt: int, shard: int) -> None:
        sent.append((plan.batch_id, executor_id))
        if len(sent) == 1:  # the log goes on being folded while a command is sent
            book.apply(BatchCompleted(aggregate_id="b2", output_file_id="file-b2", error_file_id=None, completed=3,
                                      failed=0, usage=BatchUsage()))
            book.apply(batch_created("b3", "k", "files/f", created_at=0, expires_at=NOW // 1000 + 3600))

    await Term.resend_runs(cast(Term, SimpleNamespace(book=book, _send_run=send_run)))  # no "changed size" error
    assert ("b1", "e1") in sent  # the open batch's run (whether the one that ended meanwhile is sent is no matter)


def test_a_batch_of_a_revoked_key_is_stopped_and_given_no_work_then_ends_as_a_cancel() -> None:
    """Whatever the revocation's own listing of the key's batches saw (the read model may lag the log)."""
    book = validated_book()
    book.apply(KeyRevoked(aggregate_id="k", key_sha256="ab" * 32))
    actions = decide(book, [advert("e1")], CATALOGUE, NOW)
    assert [type(action) for action in actions] == [StopRevoked]
    book.apply(BatchCancelRequested(aggregate_id="b1", requested_by_key_id="revocation", code="authorization_revoked"))
    ending = decide(book, [advert("e1")], CATALOGUE, NOW)
    assert [type(action) for action in ending] == [Finalize] and book.plans["b1"].cancel_code == "authorization_revoked"


def test_a_finalizing_batch_of_a_revoked_key_is_left_to_end_as_it_is() -> None:
    """A cancel can no longer be asked once its files are being written: the batch is not stopped (a refused cancel
    every tick), and a lost attempt is fenced as any other."""
    book = validated_book()
    assign(book, "e1", 1)
    book.apply(BatchFinalizing(aggregate_id="b1", attempt=1))
    book.apply(KeyRevoked(aggregate_id="k", key_sha256="ab" * 32))
    lost = NOW + HEARTBEAT_FRESH_MS + 1
    actions = decide(book, [advert("e1", heartbeat_at=NOW)], CATALOGUE, lost)
    assert StopRevoked not in [type(action) for action in actions]
    assert FenceAttempt in [type(action) for action in actions]
