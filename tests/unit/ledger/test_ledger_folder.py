"""The folder: groups fold while the records of earlier ones go into the sink; a record folded again before the
sink took it goes out once, in its last state; the checkpoint and `folded_through` follow the sink, never lead it."""

import asyncio
import sqlite3

import pytest

from contracts.events.batch import BatchCreated, BatchProgressed
from contracts.readmodel import BatchRecord
from services.ledger import handlers
from services.ledger.application import Ledger
from services.ledger.chain import Fact
from services.ledger.handlers import Folder
from services.ledger.projection import Projection
from tests.factories import batch_created

BATCH = "batch_folder1"


def fact(sequence: int, event: BatchCreated | BatchProgressed) -> Fact:
    return Fact(sequence, event.subject, event.model_dump_json().encode())


def created(batch_id: str) -> BatchCreated:
    return batch_created(batch_id, "key_a", "files/file-in", created_at=1_700_000_000, expires_at=1_700_086_400)


async def test_records_folded_while_the_sink_is_busy_go_out_once_in_their_last_state(ledger: Ledger) -> None:
    puts: list[list[Projection]] = []
    sink_open = asyncio.Event()

    async def slow_sink(projections: list[Projection]) -> None:
        await sink_open.wait()
        puts.append(projections)

    folder = Folder(ledger, slow_sink, start_after=0, group_size=1)
    stop = asyncio.Event()
    worker = asyncio.create_task(folder.run(stop))
    await folder.receive([fact(1, created(BATCH))])
    await asyncio.sleep(0.05)  # the first group is folded, and waits on the sink
    await folder.receive([fact(2, created("batch_folder2")), fact(3, created(BATCH))])
    await asyncio.sleep(0.05)
    assert folder.folded_through == 0 and ledger.checkpoint() == 0  # nothing is materialised before the sink took it
    sink_open.set()
    await asyncio.wait_for(folder.wait_through(3), 5)
    stop.set()
    await worker
    assert ledger.checkpoint() == 3 and folder.folded == 3
    first, rest = puts[0], [p for put in puts[1:] for p in put]
    assert [p.batch.id for p in first if isinstance(p, BatchRecord)] == [BATCH]
    later = [p for p in rest if isinstance(p, BatchRecord)]
    assert sorted(p.batch.id for p in later) == [BATCH, "batch_folder2"]  # each once, though folded in two groups
    assert next(p for p in later if p.batch.id == BATCH).last_sequence == 3  # its state after the repeated creation


async def test_a_busy_log_folds_a_quick_succession_of_facts_together_and_puts_each_record_once(
        ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    # Busy over a minute (however long the first group takes to fold on a loaded machine).
    monkeypatch.setattr(handlers, "BUSY_WINDOW_S", 60.0)
    puts: list[list[Projection]] = []

    async def sink(projections: list[Projection]) -> None:
        puts.append(projections)

    folder = Folder(ledger, sink, start_after=0, group_size=1000, pace_s=3.0, busy_facts_per_s=1)
    stop = asyncio.Event()
    worker = asyncio.create_task(folder.run(stop))
    busy = [fact(n, created(f"batch_busy{n}")) for n in range(1, 301)]  # a busy minute's worth at once
    await folder.receive(busy)
    await asyncio.wait_for(folder.wait_through(300), 10)
    for sequence in range(301, 306):  # one batch's facts, a delivery each, while the log is busy
        await folder.receive([fact(sequence, created(BATCH))])  # (folded again: the same record)
    await asyncio.sleep(0.2)
    assert folder.folded_through == 300  # the pace holds them: none is folded alone
    await asyncio.wait_for(folder.wait_through(305), 20)
    stop.set()
    await worker
    records = [p for put in puts[1:] for p in put if isinstance(p, BatchRecord) and p.batch.id == BATCH]
    assert len(records) == 1 and records[0].last_sequence == 305


async def test_a_quiet_log_folds_each_fact_at_once_whatever_the_pace(ledger: Ledger) -> None:
    async def sink(projections: list[Projection]) -> None:
        pass

    folder = Folder(ledger, sink, start_after=0, group_size=1000, pace_s=30.0)
    stop = asyncio.Event()
    worker = asyncio.create_task(folder.run(stop))
    for sequence in range(1, 4):
        await folder.receive([fact(sequence, created(f"batch_quiet{sequence}"))])
        await asyncio.wait_for(folder.wait_through(sequence), 10)  # far less than the 30 s pace
    stop.set()
    await worker


async def test_a_quiet_log_gathers_a_quick_run_of_facts_into_one_fold_and_one_put(ledger: Ledger) -> None:
    puts: list[list[Projection]] = []

    async def sink(projections: list[Projection]) -> None:
        puts.append(projections)

    folder = Folder(ledger, sink, start_after=0, group_size=1000, gather_s=1.0)
    stop = asyncio.Event()
    worker = asyncio.create_task(folder.run(stop))
    await folder.receive([fact(1, created(BATCH))])  # alone: the fold waits for more, as a create's facts come
    await asyncio.sleep(0.05)  # taken (else both would be queued, and folded together anyway)
    await folder.receive([fact(2, created("batch_folder2")), fact(3, created(BATCH))])
    await asyncio.wait_for(folder.wait_through(3), 10)
    stop.set()
    await worker
    assert len(puts) == 1  # one fold, one put: not one per delivery
    records = [p for p in puts[0] if isinstance(p, BatchRecord)]
    assert sorted(p.batch.id for p in records) == [BATCH, "batch_folder2"]
    assert next(p for p in records if p.batch.id == BATCH).last_sequence == 3


async def test_a_backlog_is_folded_without_waiting_to_gather(ledger: Ledger) -> None:
    async def sink(projections: list[Projection]) -> None:
        pass

    folder = Folder(ledger, sink, start_after=0, group_size=10, gather_s=30.0)
    folder.head_seen = 1_000  # the stream holds far more than a group past the checkpoint
    stop = asyncio.Event()
    worker = asyncio.create_task(folder.run(stop))
    await folder.receive([fact(1, created(BATCH))])
    await asyncio.wait_for(folder.wait_through(1), 10)  # far less than the 30 s gather
    stop.set()
    await worker


async def test_a_step_that_meets_a_full_disk_is_retried_with_a_line_said_and_any_other_failure_with_its_traceback(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(handlers, "RETRY_DELAYS_S", (0.0,))
    failures = [sqlite3.OperationalError("database or disk is full"), KeyError("a bug")]

    async def step() -> str:
        if failures:
            raise failures.pop(0)
        return "folded"

    assert await Folder._retried("folding", [fact(7, created(BATCH))], asyncio.Event(), step) == "folded"
    waited, failed = [r for r in caplog.records if r.name == handlers.__name__]
    assert waited.levelname == "WARNING" and "storage_full" in waited.getMessage() and waited.exc_info is None
    assert failed.levelname == "ERROR" and failed.exc_info is not None
