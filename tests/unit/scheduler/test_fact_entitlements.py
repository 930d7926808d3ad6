"""Who may state which fact and read which batch's log through the fact desk, judged on the scheduler's book."""

import pytest

from contracts.api.file import RESULT_FILE_EXPIRES_AFTER_S
from contracts.events.batch import (
    AttemptFailed,
    BatchCompleted,
    BatchFinalizing,
    BatchProgressed,
    BatchStarted,
    BatchUsage,
    BatchWaiting,
    ShardFinished,
)
from contracts.events.envelope import Event
from contracts.events.file import FileStored
from contracts.events.key import KeyRevoked
from contracts.ids import error_file_id, output_file_id, result_file_name
from contracts.subjects import input_object_key, result_chunk_key
from services.scheduler.book import Book
from services.scheduler.entitlements import clamped, may_read, may_state, superseded
from tests.unit.scheduler.test_object_broker import assigned, created, fleet


def progressed(batch: str, attempt: int, chunk: int = 0, key: str | None = None) -> BatchProgressed:
    return BatchProgressed(aggregate_id=batch, attempt=attempt, chunk=chunk,
                           chunk_key=key or result_chunk_key(batch, attempt, chunk), completed=1, failed=0)


def output_file(batch: str, owner: str = "k", file_id: str | None = None, key: str | None = None,
                named_batch: str | None = None) -> FileStored:
    file_id = file_id or output_file_id(batch)
    name = result_file_name(batch, "error" if file_id == error_file_id(batch) else "output")
    return FileStored(aggregate_id=file_id, owner_key_id=owner, filename=name, purpose="batch_output",
                      bytes=1, sha256="0" * 64, object_key=key or input_object_key(file_id), created_at=0,
                      expires_at=RESULT_FILE_EXPIRES_AFTER_S, batch_id=named_batch or batch)


def completed(batch: str) -> BatchCompleted:
    return BatchCompleted(aggregate_id=batch, output_file_id=output_file_id(batch), error_file_id=None,
                          completed=10, failed=0, usage=BatchUsage())


def test_the_executor_running_an_attempt_states_its_facts_and_the_batchs_end() -> None:
    book = fleet()
    for fact in (BatchStarted(aggregate_id="b1", executor_id="alpha", attempt=1, engine="llamacpp", engine_version="1"),
                 progressed("b1", 1), BatchFinalizing(aggregate_id="b1", attempt=1), output_file("b1"),
                 output_file("b1", file_id=error_file_id("b1")), completed("b1"),
                 AttemptFailed(aggregate_id="b1", attempt=1, executor_id="alpha", code="executor_error",
                               reason="r")):
        assert may_state(book, "alpha", fact) is None, fact.type


@pytest.mark.parametrize("fact", [
    BatchStarted(aggregate_id="b1", executor_id="bravo", attempt=1, engine="llamacpp", engine_version="1"),
    BatchStarted(aggregate_id="b1", executor_id="alpha", attempt=1, engine="llamacpp", engine_version="1"),
    progressed("b1", 1), completed("b1"), BatchFinalizing(aggregate_id="b1", attempt=1),
    ShardFinished(aggregate_id="b1", attempt=1, shard=0, executor_id="bravo"),
], ids=lambda fact: fact.type)
def test_another_executor_states_nothing_of_a_batch_it_does_not_hold(fact: Event) -> None:
    assert may_state(fleet(), "bravo", fact) is not None


def test_a_stolen_file_registration_is_refused_however_it_is_dressed() -> None:
    """The attack of issue 13: a file fact naming the attacker as owner of the victim's object."""
    book = fleet()
    victim_input = input_object_key("file-in1")
    assert may_state(book, "bravo", output_file("b2", owner="attacker", key=victim_input)) is not None
    assert may_state(book, "bravo", output_file("b2", file_id="file-new", key=victim_input)) is not None
    assert may_state(book, "bravo", output_file("b2", owner="attacker")) is not None, "owner is the batch's"
    assert may_state(book, "bravo", output_file("b1")) is not None, "b1 is alpha's"
    assert may_state(book, "bravo", output_file("b2", named_batch="nope")) is not None
    no_batch = FileStored(aggregate_id="file-new", owner_key_id="attacker", filename="x", purpose="batch",
                          bytes=1, sha256="0" * 64, object_key=victim_input, created_at=0)
    assert may_state(book, "bravo", no_batch) is not None
    assert may_state(book, "bravo", output_file("b2")) is None, "bravo's own batch's file, as its owner's"


@pytest.mark.parametrize("digest", ["", "a*", "A." + "0" * 62, "0" * 63, "G" * 64, "0" * 65])
def test_a_result_file_whose_sha256_is_not_64_hex_digits_is_refused(digest: str) -> None:
    """The digest becomes part of the owner's read-model keys: only the 64 hex digits a real one has pass."""
    stated = output_file("b2").model_copy(update={"sha256": digest})
    assert may_state(fleet(), "bravo", stated) is not None


@pytest.mark.parametrize("expires_at", [None, RESULT_FILE_EXPIRES_AFTER_S + 1, RESULT_FILE_EXPIRES_AFTER_S - 1, 0])
def test_a_result_file_expires_when_its_batch_asked_never_later_sooner_or_never(expires_at: int | None) -> None:
    """The batch's terms say how long its results are kept, not the executor: a file kept for ever costs its owner
    storage, one expiring at once loses the owner's results."""
    stated = output_file("b2").model_copy(update={"expires_at": expires_at})
    assert may_state(fleet(), "bravo", stated) is not None


def test_a_result_file_stated_in_the_future_is_stored_as_of_now_with_its_lifetime_from_now() -> None:
    """A `created_at` far ahead with `expires_at` the lifetime after it passes the check, but the desk pulls the
    date back to its own clock: the expiry comes back with it, so the file is not kept past its lifetime."""
    now_s = 1_000_000
    ahead = output_file("b2").model_copy(update={"created_at": now_s + 10**8,
                                                 "expires_at": now_s + 10**8 + RESULT_FILE_EXPIRES_AFTER_S})
    assert may_state(fleet(), "bravo", ahead) is None
    stored = clamped(ahead, now_s * 1000)
    assert isinstance(stored, FileStored)
    assert (stored.created_at, stored.expires_at) == (now_s, now_s + RESULT_FILE_EXPIRES_AFTER_S)


def test_times_stated_before_the_batch_was_created_are_stored_as_of_its_creation() -> None:
    """An executor's fact dated before its batch existed (an audit timeline read it as a date in year -10^16) is
    stored as of the creation; a result file so dated keeps its lifetime from then, never expiring at once."""
    created_s, now_s = 1_000_000, 2_000_000
    early = output_file("b2").model_copy(update={"created_at": -(2**40), "occurred_at": -(2**80),
                                                 "expires_at": -(2**40) + RESULT_FILE_EXPIRES_AFTER_S})
    stored = clamped(early, now_s * 1000, created_s * 1000)
    assert isinstance(stored, FileStored)
    assert (stored.occurred_at, stored.created_at, stored.expires_at) == (
        created_s * 1000, created_s, created_s + RESULT_FILE_EXPIRES_AFTER_S)
    started = clamped(BatchStarted(aggregate_id="b1", executor_id="alpha", attempt=1, engine="llamacpp",
                                   engine_version="1", occurred_at=5), now_s * 1000, created_s * 1000)
    assert started.occurred_at == created_s * 1000


@pytest.mark.parametrize("code", ["_type_", "_data_", "Engine Error", "engine_error\n", "x" * 65, ""])
def test_failure_codes_are_words_never_arbitrary_keys(code: str) -> None:
    """A code becomes a key of the batch's counts by code: `_type_` and `_data_` there made its stored state read
    back as a custom type of the ledger's store."""
    failed = AttemptFailed(aggregate_id="b1", attempt=1, executor_id="alpha", code=code, reason="r")
    assert may_state(fleet(), "alpha", failed) is not None
    assert may_state(fleet(), "alpha", failed.model_copy(update={"code": "engine_error"})) is None


def test_a_progress_fact_must_name_its_own_attempts_chunk() -> None:
    book = fleet()
    assert may_state(book, "alpha", progressed("b1", 1, key=result_chunk_key("b2", 1, 0))) is not None
    assert may_state(book, "alpha", progressed("b1", 1, key=result_chunk_key("b1", 2, 0))) is not None


def test_facts_that_are_not_executors_to_state_are_refused() -> None:
    book = fleet()
    assert may_state(book, "alpha", KeyRevoked(aggregate_id="h", key_sha256="h")) is not None
    assert may_state(book, "alpha", BatchWaiting(aggregate_id="b1", reason="r")) is not None


def test_a_sharded_batch_ends_only_through_the_finalizer_the_scheduler_chose() -> None:
    book = Book(admitted={"alpha", "bravo"})
    created(book, "b1", "file-in1")
    assigned(book, "b1", "alpha", 1, shard=0, shards=2)
    assigned(book, "b1", "bravo", 2, shard=1, shards=2)
    assert may_state(book, "alpha", progressed("b1", 1)) is None
    assert may_state(book, "alpha", completed("b1")) is not None
    book.plans["b1"].finalizer = "bravo"
    assert may_state(book, "bravo", completed("b1")) is None
    assert may_state(book, "bravo", output_file("b1")) is None
    for other in ("alpha", "intruder"):  # alpha ran a shard and is admitted: still not the finalizer
        assert may_state(book, other, completed("b1")) is not None
        assert may_state(book, other, output_file("b1")) is not None
    assert may_read(book, "intruder", "b1") is not None


def test_a_fenced_attempts_facts_are_superseded() -> None:
    book = fleet()
    assert not superseded(book, progressed("b1", 1))
    book.apply(AttemptFailed(aggregate_id="b1", attempt=1, executor_id="alpha", code="executor_lost", reason="r"))
    assert superseded(book, progressed("b1", 1))
    assigned(book, "b1", "bravo", 2)
    assert superseded(book, progressed("b1", 1)) and not superseded(book, progressed("b1", 2))


def test_an_executor_reads_only_the_logs_of_batches_it_was_given() -> None:
    book = fleet()
    assert may_read(book, "alpha", "b1") is None
    assert may_read(book, "alpha", "b2") is not None
    assert may_read(book, "alpha", "unknown") is not None
    book.plans["b2"].finalizer = "alpha"
    assert may_read(book, "alpha", "b2") is None
