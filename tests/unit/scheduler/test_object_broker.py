"""Who may have a URL to which object: an executor reaches only its own work's objects, judged on the book."""

import pytest

from contracts.events.batch import (
    AttemptFailed,
    BatchAssigned,
    BatchCompleted,
    BatchUsage,
    BatchValidated,
    ShardFinished,
)
from contracts.ids import error_file_id, output_file_id
from contracts.objects import ObjectOperation, ObjectRequest, chunk_attempt
from contracts.subjects import input_object_key, rejections_key, result_chunk_key
from services.scheduler.book import Book
from services.scheduler.objects import authorize
from tests.factories import batch_created
from tests.unit.authz.test_nats_permissions import allowed


def created(book: Book, batch: str, file_id: str) -> None:
    book.apply(batch_created(batch, "k", input_object_key(file_id), created_at=0, expires_at=10**10))
    book.apply(BatchValidated(aggregate_id=batch, total_lines=10, model="m",
                              rejections_object_key=rejections_key(batch)))


def assigned(book: Book, batch: str, executor: str, attempt: int, shard: int = 0, shards: int = 1) -> None:
    book.apply(BatchAssigned(aggregate_id=batch, executor_id=executor, attempt=attempt, lease_token="t",
                             shard=shard, shards=shards, shard_span=5 if shards > 1 else 0))


def fleet() -> Book:
    """b1 runs on alpha (attempt 1); b2 on bravo (attempt 1); alpha and bravo are admitted."""
    book = Book(admitted={"alpha", "bravo"})
    created(book, "b1", "file-in1")
    created(book, "b2", "file-in2")
    assigned(book, "b1", "alpha", 1)
    assigned(book, "b2", "bravo", 1)
    return book


def ask(book: Book, executor: str, operation: ObjectOperation, batch: str, key: str, attempt: int = 0) -> str | None:
    return authorize(book, executor, ObjectRequest(operation=operation, batch_id=batch, key=key, attempt=attempt))


def test_the_executor_running_a_batch_reads_its_input_rejections_and_chunks_and_writes_its_own_chunks() -> None:
    book = fleet()
    assert ask(book, "alpha", "get", "b1", "files/file-in1") is None
    assert ask(book, "alpha", "get", "b1", rejections_key("b1")) is None
    assert ask(book, "alpha", "list", "b1", rejections_key("b1")) is None
    assert ask(book, "alpha", "list", "b1", "results/b1/") is None
    assert ask(book, "alpha", "get", "b1", result_chunk_key("b1", 0, 3)) is None
    assert ask(book, "alpha", "put", "b1", result_chunk_key("b1", 1, 0), attempt=1) is None
    assert ask(book, "alpha", "put", "b1", input_object_key(output_file_id("b1"))) is None
    assert ask(book, "alpha", "put", "b1", input_object_key(error_file_id("b1"))) is None


@pytest.mark.parametrize(("operation", "batch", "key"), [
    ("get", "b2", "files/file-in2"),
    ("get", "b1", "files/file-in2"),
    ("get", "b1", "files/file-someone-elses"),
    ("get", "b1", "files/" + output_file_id("b2")),
    ("get", "b1", "results/b2/attempt-1/chunk-000000.jsonl"),
    ("get", "b1", rejections_key("b2")),
    ("list", "b1", "results/"),
    ("list", "b1", "results/b1"),
    ("list", "b1", "files/"),
    ("list", "b2", "results/b2/"),
    ("put", "b1", "files/file-in1"),
    ("put", "b1", "files/file-new"),
    ("put", "b1", rejections_key("b1")),
    ("put", "b1", input_object_key(output_file_id("b2"))),
])
def test_another_batchs_objects_and_any_other_file_are_refused(operation: ObjectOperation, batch: str,
                                                               key: str) -> None:
    assert ask(fleet(), "alpha", operation, batch, key) is not None


@pytest.mark.parametrize("key", ["results/b1/../../files/file-in2", "results/b1//x", "results/b1/./x",
                                 "results/b1/..", "results/b1/x\\..\\..\\files\\file-in2"])
def test_a_key_a_server_could_resolve_elsewhere_is_refused(key: str) -> None:
    reason = ask(fleet(), "alpha", "get", "b1", key)
    assert reason is not None and "plain" in reason


def test_an_executor_writes_only_the_chunks_of_its_own_live_attempt() -> None:
    book = fleet()
    assert ask(book, "alpha", "put", "b1", result_chunk_key("b1", 2, 0), attempt=2) is not None
    assert ask(book, "alpha", "put", "b1", result_chunk_key("b1", 2, 0), attempt=1) is not None
    assert ask(book, "bravo", "put", "b1", result_chunk_key("b1", 1, 0), attempt=1) is not None


def test_a_fenced_attempt_loses_access_and_its_successor_gains_it() -> None:
    book = fleet()
    book.apply(AttemptFailed(aggregate_id="b1", attempt=1, executor_id="alpha", code="executor_lost", reason="x"))
    assert ask(book, "alpha", "get", "b1", "files/file-in1") is not None
    assert ask(book, "alpha", "put", "b1", result_chunk_key("b1", 1, 4), attempt=1) is not None
    assigned(book, "b1", "bravo", 2)
    assert ask(book, "bravo", "get", "b1", "files/file-in1") is None
    assert ask(book, "bravo", "put", "b1", result_chunk_key("b1", 2, 0), attempt=2) is None


def test_a_batch_being_finalized_is_open_to_its_chosen_finalizer_alone_until_it_ends() -> None:
    book = fleet()
    book.apply(AttemptFailed(aggregate_id="b1", attempt=1, executor_id="alpha", code="batch_expired", reason="x"))
    assert ask(book, "bravo", "get", "b1", "files/file-in1") is not None
    book.plans["b1"].finalizer = "bravo"
    assert ask(book, "bravo", "get", "b1", "files/file-in1") is None
    assert ask(book, "bravo", "list", "b1", "results/b1/") is None
    assert ask(book, "bravo", "put", "b1", input_object_key(output_file_id("b1"))) is None
    assert ask(book, "bravo", "put", "b1", result_chunk_key("b1", 1, 0), attempt=1) is not None, "no chunks"
    for other in ("alpha", "intruder"):  # alpha ran it before; admitted or not, neither finalizes it now
        assert ask(book, other, "get", "b1", "files/file-in1") is not None
        assert ask(book, other, "put", "b1", input_object_key(output_file_id("b1"))) is not None
    book.plans["b1"].finalizer = "alpha"
    assert ask(book, "alpha", "get", "b1", "files/file-in1") is None
    assert ask(book, "bravo", "get", "b1", "files/file-in1") is not None, "a finalizer replaced loses its access"
    book.apply(BatchCompleted(aggregate_id="b1", output_file_id=None, error_file_id=None, completed=10, failed=0,
                              usage=BatchUsage()))
    assert ask(book, "alpha", "get", "b1", "files/file-in1") is not None


def test_a_shard_runner_reads_and_writes_chunks_but_only_the_finalizer_writes_the_files() -> None:
    book = Book(admitted={"alpha", "bravo"})
    created(book, "b3", "file-in3")
    assigned(book, "b3", "alpha", 1, shard=0, shards=2)
    assigned(book, "b3", "bravo", 2, shard=1, shards=2)
    assert ask(book, "bravo", "put", "b3", result_chunk_key("b3", 2, 0), attempt=2) is None
    assert ask(book, "bravo", "put", "b3", result_chunk_key("b3", 1, 0), attempt=1) is not None
    assert ask(book, "bravo", "put", "b3", input_object_key(output_file_id("b3"))) is not None
    book.apply(ShardFinished(aggregate_id="b3", attempt=2, shard=1, executor_id="bravo"))
    assert ask(book, "bravo", "get", "b3", "files/file-in3") is not None, "its shard is done"


def test_unknown_batches_are_refused() -> None:
    assert ask(fleet(), "alpha", "get", "b9", "files/file-in1") is not None


def test_a_chunk_key_names_its_batch_and_attempt() -> None:
    assert chunk_attempt(result_chunk_key("b1", 7, 12)) == ("b1", 7)
    assert chunk_attempt("results/b1/attempt-7/chunk-000001.json") is None
    assert chunk_attempt("files/x") is None


def test_only_the_executor_itself_may_ask_on_its_object_subject() -> None:
    assert allowed("svc.objects.alpha", "alpha")
    assert not allowed("svc.objects.bravo", "alpha")
    assert not allowed("svc.objects.*", "alpha")


def test_an_attempt_writes_no_more_chunks_than_its_unit_has_lines() -> None:
    """Each chunk commits at least one line: URLs for more would let an executor fill the object store."""
    book = fleet()  # b1: 10 lines, one unit, attempt 1 on alpha
    assert ask(book, "alpha", "put", "b1", result_chunk_key("b1", 1, 9), attempt=1) is None
    assert ask(book, "alpha", "put", "b1", result_chunk_key("b1", 1, 10), attempt=1) is not None
    assert ask(book, "alpha", "put", "b1", result_chunk_key("b1", 1, 10**9), attempt=1) is not None
    created(book, "b3", "file-in3")
    assigned(book, "b3", "bravo", 1, shard=1, shards=2)  # b3's second unit: 5 of its 10 lines
    assert ask(book, "bravo", "put", "b3", result_chunk_key("b3", 1, 4), attempt=1) is None
    assert ask(book, "bravo", "put", "b3", result_chunk_key("b3", 1, 5), attempt=1) is not None
