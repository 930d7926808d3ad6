"""Who may read the model weights kept in the object store: every executor of the fleet, and only them; the
rule opens nothing else."""

from contracts.events.executor import ExecutorLost
from contracts.objects import ObjectOperation, ObjectRequest
from contracts.subjects import input_object_key
from services.scheduler.book import Book
from services.scheduler.objects import authorize
from tests.unit.scheduler.test_object_broker import assigned, created

WEIGHTS = "models/smollm2/0123456789ab/SmolLM2-135M-Instruct.Q4_1.gguf"


def ask(book: Book, executor: str, key: str, operation: ObjectOperation = "get", batch: str = "") -> str | None:
    return authorize(book, executor, ObjectRequest(operation=operation, batch_id=batch, key=key))


def fleet() -> Book:
    """alpha and bravo are admitted; b1 runs on alpha."""
    book = Book(admitted={"alpha", "bravo"})
    created(book, "b1", "file-in1")
    assigned(book, "b1", "alpha", 1)
    return book


def test_an_admitted_executor_reads_a_model_object_outside_any_batch_or_within_any() -> None:
    book = fleet()
    assert ask(book, "bravo", WEIGHTS) is None  # loading before it has any work
    assert ask(book, "alpha", WEIGHTS, batch="b1") is None
    assert ask(book, "bravo", WEIGHTS, batch="b1") is None  # the batch named does not matter for weights


def test_an_executor_never_admitted_or_declared_lost_is_refused_the_weights() -> None:
    book = fleet()
    assert "not admitted to the fleet" in (ask(book, "stranger", WEIGHTS) or "")
    book.apply(ExecutorLost(aggregate_id="bravo", last_heartbeat_at=10))
    assert "declared lost" in (ask(book, "bravo", WEIGHTS) or "")


def test_model_objects_are_only_read_one_by_one_never_written_listed_or_reached_by_a_crooked_key() -> None:
    book = fleet()
    writes_and_lists: tuple[ObjectOperation, ...] = ("put", "list")
    for operation in writes_and_lists:
        assert "only read one" in (ask(book, "alpha", WEIGHTS, operation=operation) or "")
    for key in ("models/../files/file-in1", "models/", "models//x", "models/./x"):
        assert "only read one" in (ask(book, "alpha", key) or "")


def test_the_weights_rule_opens_nothing_else_to_the_fleet() -> None:
    book = fleet()
    assert ask(book, "bravo", input_object_key("file-in1"), batch="b1") is not None  # not its batch
    assert ask(book, "bravo", input_object_key("file-in1")) is not None
    assert ask(book, "alpha", "modelsx/weights.gguf") is not None
