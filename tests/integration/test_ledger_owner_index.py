"""The per-owner index in the read model against a real broker: the ledger files each batch and live file under
its owner (a user, across their keys), rebuilds the index from the log, and a replay finds nothing to differ."""

from pathlib import Path

import pytest
from eventsourcing.persistence import Tracking

from contracts.events.batch import BatchCreated, BatchFailed
from contracts.events.envelope import Event
from contracts.events.file import FileDeleted, FileStored
from contracts.events.key import KeyCreated, UserCreated
from contracts.ids import key_id_for_hash
from contracts.subjects import READ_MODEL_BUCKET, owner_live_key
from services.ledger.application import Ledger, persistence_env
from services.ledger.projection import KeyProjection, project, projection_key
from services.ledger.reindex import OWNER_INDEX
from services.ledger.replay import diff_against_live
from services.ledger.rules import FoldingRules
from services.runtime.nats import eventlog
from services.runtime.nats.bus import EventBus
from services.runtime.nats.readmodel import ReadModel
from tests.conftest import RunningNats
from tests.factories import batch_created
from tests.integration.test_ledger_rebuild import T0, folded_through, running_ledger, store_files

LAPTOP, PHONE, LONE = "a1" * 32, "b2" * 32, "c3" * 32
ALICE, LONE_OWNER = "user-alice", f"key-{key_id_for_hash(LONE)}"


def stored(file_id: str, key_sha: str) -> FileStored:
    return FileStored(aggregate_id=file_id, owner_key_id=key_id_for_hash(key_sha), filename=f"{file_id}.jsonl",
                      purpose="batch", bytes=10, sha256="cd" * 32, object_key=f"files/{file_id}", created_at=T0)


def created(batch_id: str, key_sha: str, file_id: str) -> BatchCreated:
    return batch_created(batch_id, key_id_for_hash(key_sha), f"files/{file_id}", created_at=T0, expires_at=T0 + 86400)


def history() -> list[Event]:
    """Alice works from two keys; a key without a user works alone."""
    return [
        UserCreated(aggregate_id="alice"),
        KeyCreated(aggregate_id=LAPTOP[:32], key_sha256=LAPTOP, role="user", label="laptop", user_id="alice"),
        KeyCreated(aggregate_id=PHONE[:32], key_sha256=PHONE, role="user", label="phone", user_id="alice"),
        KeyCreated(aggregate_id=LONE[:32], key_sha256=LONE, role="user", label="lone"),
        stored("file-a", LAPTOP), stored("file-b", PHONE), stored("file-c", LONE),
        created("batch_a", PHONE, "file-a"), created("batch_c", LONE, "file-c"),
        FileDeleted(aggregate_id="file-b", owner_key_id=key_id_for_hash(PHONE)),
    ]


async def owners_view(read_model: ReadModel) -> dict[str, tuple[list[str], list[str]]]:
    view = {}
    for owner in (ALICE, LONE_OWNER):
        files = sorted(r.file.id for r in await read_model.owner_files(owner))
        batches = sorted(r.batch.id for r in await read_model.owner_batches(owner))
        view[owner] = (files, batches)
    return view


async def test_the_owner_index_files_each_record_under_its_user_and_is_rebuilt_from_the_log(
        fresh_nats: RunningNats, tmp_path: Path) -> None:
    bus = await EventBus.connect(fresh_nats.url, "tests")
    try:
        for fact in history():
            await bus.publish(fact)
        db_path = tmp_path / "ledger.sqlite"
        expected = {ALICE: (["file-a"], ["batch_a"]), LONE_OWNER: (["file-c"], ["batch_c"])}
        async with running_ledger(fresh_nats.url, db_path):
            read_model = await ReadModel.open(bus)
            assert await owners_view(read_model) == expected
            assert await diff_against_live(bus, read_model) == []

        for path in store_files(db_path):
            path.unlink(missing_ok=True)
        await bus.js.delete_key_value(READ_MODEL_BUCKET)
        async with running_ledger(fresh_nats.url, db_path):
            read_model = await ReadModel.open(bus)
            assert await owners_view(read_model) == expected
            assert await diff_against_live(bus, read_model) == []
    finally:
        await bus.close()


async def test_a_replay_reports_an_owner_index_entry_no_fact_makes(fresh_nats: RunningNats, tmp_path: Path) -> None:
    bus = await EventBus.connect(fresh_nats.url, "tests")
    try:
        for fact in history():
            await bus.publish(fact)
        async with running_ledger(fresh_nats.url, tmp_path / "ledger.sqlite"):
            read_model = await ReadModel.open(bus)
            record = await read_model.get_file("file-a")
            assert record is not None
            await read_model.kv.put(f"owner.{LONE_OWNER}.file.file-a", record.model_dump_json().encode())
            differences = await diff_against_live(bus, read_model)
        assert differences == [f"owner.{LONE_OWNER}.file.file-a: in the read model, but no fact in the log makes it"]
    finally:
        await bus.close()


async def test_a_ledger_that_folded_before_ownership_by_user_indexes_its_owners_at_its_next_start(
        fresh_nats: RunningNats, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bus = await EventBus.connect(fresh_nats.url, "tests")
    db_path = tmp_path / "ledger.sqlite"
    try:
        for fact in history():
            await bus.publish(fact)
        read_model = await ReadModel.open(bus)
        with monkeypatch.context() as older:  # as the ledger did before keys' users were remembered
            older.setattr(FoldingRules, "_note_key_owner", lambda *args: None)
            ledger = Ledger(persistence_env(db_path))
            facts = [fact async for fact in eventlog.read(bus)]
            for projection in (project(a, ledger.user_of_key) for a in ledger.fold_facts(facts)):
                if projection is not None and not isinstance(projection, KeyProjection):
                    await read_model.kv.put(projection_key(projection), projection.model_dump_json().encode())
            ledger.record_checkpoint(facts[-1].sequence)
            ledger.close()
        assert await owners_view(read_model) == {ALICE: ([], []), LONE_OWNER: ([], [])}

        async with running_ledger(fresh_nats.url, db_path) as app:
            assert app.folder is not None and app.folder.folded == 0
            assert await owners_view(read_model) == {ALICE: (["file-a"], ["batch_a"]),
                                                     LONE_OWNER: (["file-c"], ["batch_c"])}
            file = await read_model.get_file("file-a")
            assert file is not None and file.owner_user_id == "alice"
            assert await diff_against_live(bus, read_model) == []
    finally:
        await bus.close()


async def test_an_owners_live_list_holds_each_batch_from_its_creation_until_it_ends_and_a_replay_agrees(
        fresh_nats: RunningNats, tmp_path: Path) -> None:
    bus = await EventBus.connect(fresh_nats.url, "tests")
    try:
        for fact in [*history(), created("batch_a2", LAPTOP, "file-a")]:
            await bus.publish(fact)
        async with running_ledger(fresh_nats.url, tmp_path / "ledger.sqlite") as app:
            read_model = await ReadModel.open(bus)
            assert set(await read_model.owner_live_list(ALICE)) == {"batch_a", "batch_a2"}  # across Alice's keys
            assert set(await read_model.owner_live_list(LONE_OWNER)) == {"batch_c"}
            assert set(await read_model.owner_live_list("user-nobody")) == set()
            ended = await bus.publish(BatchFailed(aggregate_id="batch_a", code="test", reason="ended by the test"))
            await folded_through(app, ended)
            assert set(await read_model.owner_live_list(ALICE)) == {"batch_a2"}
            assert [r.batch.id for r in await read_model.owner_live_batches(ALICE)] == ["batch_a2"]
            assert await diff_against_live(bus, read_model) == []
    finally:
        await bus.close()


async def test_a_read_model_made_before_live_lists_gets_them_at_the_ledgers_next_start(
        fresh_nats: RunningNats, tmp_path: Path) -> None:
    bus = await EventBus.connect(fresh_nats.url, "tests")
    db_path = tmp_path / "ledger.sqlite"
    try:
        for fact in [*history(), BatchFailed(aggregate_id="batch_c", code="test", reason="ended by the test")]:
            await bus.publish(fact)
        read_model = await ReadModel.open(bus)
        ledger = Ledger(persistence_env(db_path))  # as the ledger did before the lists existed (owners indexed)
        facts = [fact async for fact in eventlog.read(bus)]
        for projection in (project(a, ledger.user_of_key) for a in ledger.fold_facts(facts)):
            if projection is not None and not isinstance(projection, KeyProjection):
                await read_model.kv.put(projection_key(projection), projection.model_dump_json().encode())
        ledger.record_checkpoint(facts[-1].sequence)
        ledger.tracking.insert_tracking(Tracking(application_name=OWNER_INDEX, notification_id=1))
        ledger.close()
        assert set(await read_model.owner_live_list(ALICE)) == set()

        async with running_ledger(fresh_nats.url, db_path) as app:
            assert app.folder is not None and app.folder.folded == 0
            assert set(await read_model.owner_live_list(ALICE)) == {"batch_a"}
            assert set(await read_model.owner_live_list(LONE_OWNER)) == set()
            assert await read_model.kv.get(owner_live_key(LONE_OWNER))  # an empty list, as a replay makes it
        async with running_ledger(fresh_nats.url, db_path):  # once only
            assert set(await read_model.owner_live_list(ALICE)) == {"batch_a"}
    finally:
        await bus.close()
