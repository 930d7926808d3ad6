"""The ledger against a real broker: it materialises the stream, shrugs off duplicates, rebuilds and resumes."""

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from contracts.api.batch import BatchUsage
from contracts.events.batch import (
    BatchAssigned,
    BatchCompleted,
    BatchFinalizing,
    BatchProgressed,
    BatchStarted,
    BatchValidated,
    BatchValidationFailed,
    BatchWaiting,
    LineRejected,
)
from contracts.events.envelope import Event
from contracts.events.executor import ExecutorAdvert, ExecutorRegistered
from contracts.events.file import FileDeleted, FileStored
from contracts.events.key import KeyCreated
from contracts.ids import key_id_for_hash
from contracts.subjects import READ_MODEL_BUCKET
from services.ledger.app import LedgerApp, create_app
from services.ledger.replay import diff_against_live
from services.ledger.settings import LedgerSettings
from services.runtime.nats.bus import EventBus
from services.runtime.nats.readmodel import ReadModel
from services.runtime.process.settings import ConnectionSettings
from tests.conftest import RunningNats
from tests.factories import batch_created

GOOD, BAD = "batch_good", "batch_bad"
KEY_SHA = "ab" * 32
T0 = 1_700_000_000
WAIT_S = 20.0


def history() -> list[Event]:
    """Two batches as the services would tell them: one runs to completion (telling where it stands while queued
    and while running), one fails validation."""
    at = iter(range((T0 + 1) * 1000, (T0 + 10_000) * 1000, 1000))
    usage = BatchUsage(input_tokens=40, output_tokens=20, total_tokens=60)
    advert = ExecutorAdvert(executor_id="exec-1", engine="llamacpp", engine_version="1", models=["m"],
                            loaded_models=[], devices=[], slots=4, heartbeat_at=T0)
    facts: list[Event] = [KeyCreated(aggregate_id="key_ab", key_sha256=KEY_SHA, role="user", label="alice")]
    for batch_id in (GOOD, BAD):
        facts += [
            FileStored(aggregate_id=f"file-{batch_id}", owner_key_id="key_ab", filename=f"{batch_id}.jsonl",
                       purpose="batch", bytes=100, sha256="cd" * 32, object_key=f"files/file-{batch_id}",
                       created_at=T0),
            batch_created(batch_id, "key_ab", f"files/file-{batch_id}", created_at=T0, expires_at=T0 + 86400,
                          occurred_at=next(at)),
        ]
    facts += [LineRejected(aggregate_id=BAD, line=n, code="invalid_json", message="not JSON", occurred_at=next(at))
              for n in range(1, 131)]
    facts += [
        BatchValidationFailed(aggregate_id=BAD, total_lines=200, error_count=130,
                              counts_by_code={"invalid_json": 130}, occurred_at=next(at)),
        FileDeleted(aggregate_id=f"file-{BAD}", owner_key_id="key_ab"),
        ExecutorRegistered(aggregate_id="exec-1", advert=advert, started_at=T0),
        BatchValidated(aggregate_id=GOOD, total_lines=4, model="m", occurred_at=next(at)),
        BatchWaiting(aggregate_id=GOOD, reason="Queued: 1st for m, under a minute.", occurred_at=next(at)),
        BatchAssigned(aggregate_id=GOOD, executor_id="exec-1", attempt=1, lease_token="t", occurred_at=next(at)),
        BatchStarted(aggregate_id=GOOD, executor_id="exec-1", attempt=1, engine="llamacpp", engine_version="1",
                     occurred_at=next(at)),
        BatchProgressed(aggregate_id=GOOD, attempt=1, chunk=0, chunk_key="c0", completed=2, failed=0,
                        occurred_at=next(at)),
        BatchWaiting(aggregate_id=GOOD, reason="Running on 1 executor: 50 % done, under a minute left.",
                     occurred_at=next(at)),
        BatchProgressed(aggregate_id=GOOD, attempt=1, chunk=1, chunk_key="c1", completed=3, failed=1,
                        occurred_at=next(at)),
        BatchFinalizing(aggregate_id=GOOD, attempt=1, occurred_at=next(at)),
        BatchCompleted(aggregate_id=GOOD, output_file_id="file-out", error_file_id="file-err", completed=3,
                       failed=1, usage=usage, occurred_at=next(at)),
    ]
    return facts


@pytest.fixture
async def told(fresh_nats: RunningNats) -> AsyncIterator[EventBus]:
    """A broker of the test's own whose stream holds `history()`, at sequences 1..len(history())."""
    bus = await EventBus.connect(fresh_nats.url, "tests")
    for fact in history():
        await bus.publish(fact)
    yield bus
    await bus.close()


def sqlite_settings(url: str, db_path: Path) -> LedgerSettings:
    return LedgerSettings(connection=ConnectionSettings(nats_url=url), db_path=db_path)


@asynccontextmanager
async def running_ledger(url: str, db_path: Path, settings: LedgerSettings | None = None
                         ) -> AsyncIterator[LedgerApp]:
    app = create_app(settings or sqlite_settings(url, db_path))
    stop = asyncio.Event()
    task = asyncio.create_task(app.run(stop))
    try:
        await asyncio.wait_for(app.caught_up.wait(), WAIT_S)
        yield app
    finally:
        stop.set()
        await asyncio.wait_for(task, WAIT_S)


async def folded_through(app: LedgerApp, sequence: int) -> None:
    assert app.folder is not None
    await asyncio.wait_for(app.folder.wait_through(sequence), WAIT_S)


async def read_model_dump(read_model: ReadModel) -> dict[str, Any]:
    key = await read_model.get_api_key(KEY_SHA)
    return {
        "batches": sorted((r.model_dump() for r in await read_model.list_batches()), key=lambda r: r["batch"]["id"]),
        "files": sorted((r.model_dump() for r in await read_model.list_files()), key=lambda r: r["file"]["id"]),
        "key": key.model_dump() if key else None,
    }


async def revisions(read_model: ReadModel) -> dict[str, int | None]:
    return {key: (await read_model.kv.get(key)).revision for key in await read_model.kv.keys()}


def store_files(db_path: Path) -> list[Path]:
    return [db_path.with_name(db_path.name + suffix) for suffix in ("", "-wal", "-shm")]


async def test_the_ledger_materialises_batches_files_and_keys(
    told: EventBus, fresh_nats: RunningNats, tmp_path: Path
) -> None:
    bus, head = told, len(history())
    async with running_ledger(fresh_nats.url, tmp_path / "ledger.sqlite"):
        read_model = await ReadModel.open(bus)
        good, bad = await read_model.get_batch(GOOD), await read_model.get_batch(BAD)
        assert good is not None and bad is not None
        assert good.last_sequence == head and good.owner_key_id == "key_ab"
        assert good.batch.status == "completed" and good.batch.model == "m" and good.batch.status_reason is None
        assert good.batch.request_counts.model_dump() == {"total": 4, "completed": 3, "failed": 1}
        assert (good.batch.output_file_id, good.batch.error_file_id) == ("file-out", "file-err")
        assert good.batch.usage is not None and good.batch.usage.total_tokens == 60
        assert good.batch.in_progress_at is not None and good.batch.completed_at is not None
        assert good.batch.completed_at > good.batch.in_progress_at > good.batch.created_at
        assert bad.batch.status == "failed" and bad.batch.errors is not None
        assert (len(bad.batch.errors.data), bad.batch.errors.total) == (100, 130)
        assert bad.batch.request_counts.total == 200
        deleted, kept = await read_model.get_file(f"file-{BAD}"), await read_model.get_file(f"file-{GOOD}")
        assert deleted is not None and deleted.deleted and kept is not None and not kept.deleted
        assert kept.file.filename == f"{GOOD}.jsonl" and kept.file.status == "processed"
        key = await read_model.get_api_key(KEY_SHA)
        assert key is not None and key.key_id == key_id_for_hash(KEY_SHA) and key.role == "user"


async def test_a_fact_published_again_changes_nothing(
    told: EventBus, fresh_nats: RunningNats, tmp_path: Path
) -> None:
    bus, facts = told, history()
    head = len(facts)
    async with running_ledger(fresh_nats.url, tmp_path / "ledger.sqlite") as app:
        read_model = await ReadModel.open(bus)
        before = await read_model_dump(read_model)
        assert await bus.publish(facts[-1]) == head  # the broker drops a retried publish of the same fact
        # The same fact again under another id, as after the dedup window: refused, the batch stays completed.
        late = await bus.publish(facts[-1].model_copy(update={"event_id": "late-copy"}))
        await folded_through(app, late)
        after = await read_model_dump(read_model)
    good_after = next(b for b in after["batches"] if b["batch"]["id"] == GOOD)
    good_before = next(b for b in before["batches"] if b["batch"]["id"] == GOOD)
    assert (good_before.pop("last_sequence"), good_after.pop("last_sequence")) == (head, late)
    assert after == before


async def test_deleting_the_store_and_restarting_rebuilds_an_identical_read_model(
    told: EventBus, fresh_nats: RunningNats, tmp_path: Path
) -> None:
    bus = told
    db_path = tmp_path / "ledger.sqlite"
    async with running_ledger(fresh_nats.url, db_path):
        before = await read_model_dump(await ReadModel.open(bus))
    for path in store_files(db_path):
        path.unlink(missing_ok=True)
    await bus.js.delete_key_value(READ_MODEL_BUCKET)

    async with running_ledger(fresh_nats.url, db_path) as app:
        assert app.folder is not None and app.folder.folded == len(history())
        read_model = await ReadModel.open(bus)
        assert await read_model_dump(read_model) == before
        assert await diff_against_live(bus, read_model) == []


async def test_a_restart_with_the_store_kept_resumes_after_its_checkpoint(
    told: EventBus, fresh_nats: RunningNats, tmp_path: Path
) -> None:
    bus = told
    db_path = tmp_path / "ledger.sqlite"
    async with running_ledger(fresh_nats.url, db_path):
        read_model = await ReadModel.open(bus)
        before = await revisions(read_model)

    async with running_ledger(fresh_nats.url, db_path) as app:
        assert app.folder is not None and app.folder.folded == 0
        assert await revisions(read_model) == before
        newer = await bus.publish(KeyCreated(aggregate_id="key_ef", key_sha256="ef" * 32, role="worker",
                                             label="gpu-1"))
        await folded_through(app, newer)
        assert app.folder.folded == 1
        assert await read_model.get_api_key("ef" * 32) is not None
