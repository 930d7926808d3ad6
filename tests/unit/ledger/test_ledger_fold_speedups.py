"""What the ledger's fold remembers between groups to go fast, and why it never changes what is folded."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from contracts.events.batch import BatchAssigned, BatchCreated, BatchProgressed, BatchStarted, BatchValidated
from contracts.events.envelope import Event
from contracts.events.executor import ExecutorAdvert, ExecutorRegistered
from services.ledger.application import Ledger, persistence_env
from tests.factories import batch_created

BATCH = "batch_speed1"


@pytest.fixture(params=["popo", "sqlite"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Ledger]:
    # A cache of one aggregate: the next group finds the others in the store, or knows they are missing.
    app = Ledger(persistence_env(None if request.param == "popo" else tmp_path / "ledger.sqlite"), cache_size=1)
    yield app
    app.close()


def created(batch_id: str = BATCH) -> BatchCreated:
    return batch_created(batch_id, "key_a", "files/file-in", created_at=1_700_000_000, expires_at=1_700_086_400)


def running() -> list[Event]:
    return [BatchValidated(aggregate_id=BATCH, total_lines=30, model="m"),
            BatchAssigned(aggregate_id=BATCH, executor_id="exec-1", attempt=1, lease_token="t"),
            BatchStarted(aggregate_id=BATCH, executor_id="exec-1", attempt=1, engine="llamacpp", engine_version="1")]


def progressed(chunk: int, completed: int, failed: int = 0) -> BatchProgressed:
    return BatchProgressed(aggregate_id=BATCH, attempt=1, chunk=chunk, chunk_key=f"c{chunk}", completed=completed,
                           failed=failed)


def registered() -> ExecutorRegistered:
    advert = ExecutorAdvert(executor_id="exec-1", engine="llamacpp", engine_version="1", models=["m"],
                            loaded_models=[], devices=[], slots=1, heartbeat_at=1)
    return ExecutorRegistered(aggregate_id="exec-1", advert=advert, started_at=1, worker_key_id="key_w")


def test_a_batch_unknown_when_a_fact_named_it_is_folded_once_it_is_created(ledger: Ledger) -> None:
    ledger.fold([(1, progressed(0, 5))])  # skipped: no such batch yet
    ledger.fold([(2, created()), (3, created("batch_other"))])  # the other one is the one cached
    ledger.fold([(4 + n, fact) for n, fact in enumerate(running())])
    ledger.fold([(7, progressed(1, 10))])
    batch = ledger.batch(BATCH)
    assert batch is not None and batch.status == "in_progress" and batch.completed == 10


def test_an_executor_registered_after_its_lines_were_served_is_credited_from_then_on(ledger: Ledger) -> None:
    ledger.fold([(n, fact) for n, fact in enumerate([created(), *running(), progressed(0, 4)], start=1)])
    ledger.fold([(6, registered()), (7, created("batch_other"))])
    ledger.fold([(8, progressed(1, 9))])
    executor = ledger.executor("exec-1")
    assert executor is not None and executor.lines_served == 5


def test_a_run_of_progress_facts_folds_to_the_highest_counts_of_the_latest_fact(ledger: Ledger) -> None:
    ledger.fold([(n, fact) for n, fact in enumerate([created(), *running()], start=1)])
    ledger.fold([(5, progressed(0, 8, 1)), (6, progressed(2, 6, 2)), (7, progressed(1, 7, 0))])
    batch = ledger.batch(BATCH)
    assert batch is not None and (batch.completed, batch.failed, batch.last_sequence) == (8, 2, 7)
