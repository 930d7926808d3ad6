"""Each owner's stored bytes and files by digest in the read model against a real broker: kept by the ledger as files
are stored and deleted (however often a record is put again), not counting expired files, written once for a read
model made before them (and until then counted from the owner's index), and made alike by a replay."""

import asyncio
import time
from pathlib import Path

import pytest
from eventsourcing.persistence import Tracking

from contracts.api.batch import Batch
from contracts.events.file import FileDeleted, FileStored
from contracts.ids import key_id_for_hash
from contracts.readmodel import BatchRecord, FileRecord
from services.ledger.application import Ledger, persistence_env
from services.ledger.projection import KeyProjection, project, projection_key
from services.ledger.reindex import LIVE_INDEX, OWNER_INDEX
from services.ledger.replay import diff_against_live
from services.runtime.nats import eventlog, stored_bytes
from services.runtime.nats.bus import EventBus
from services.runtime.nats.read_entries import owner_copy
from services.runtime.nats.readmodel import ReadModel
from tests.conftest import RunningNats
from tests.integration.test_ledger_owner_index import ALICE, LAPTOP, LONE_OWNER, PHONE, history
from tests.integration.test_ledger_rebuild import folded_through, running_ledger
from tests.support import put_batch

SAME = "cd" * 32
"""The digest every file of `history` has (10 bytes each)."""


def file_record(file_id: str, *, size: int = 10, expires_at: int | None = None, sha256: str = "ab" * 32,
                deleted: bool = False, user: str = "alice") -> FileRecord:
    """A file of the user's (Alice's), created moments ago."""
    return FileRecord.model_validate({
        "owner_key_id": "k1", "owner_user_id": user, "object_key": f"files/{file_id}", "sha256": sha256,
        "deleted": deleted, "file": {
            "id": file_id, "bytes": size, "created_at": int(time.time()) - 10, "filename": "in.jsonl",
            "purpose": "batch", "status": "processed", "expires_at": expires_at}})


async def test_an_owners_stored_bytes_count_their_files_until_deleted_and_a_replay_agrees(
        fresh_nats: RunningNats, tmp_path: Path) -> None:
    bus = await EventBus.connect(fresh_nats.url, "tests")
    try:
        for fact in history():  # Alice stores file-a and file-b (deleted); the lone key file-c
            await bus.publish(fact)
        other = FileStored(aggregate_id="file-d", owner_key_id=key_id_for_hash(LAPTOP), filename="d.jsonl",
                           purpose="batch", bytes=32, sha256="ef" * 32, object_key="files/file-d",
                           created_at=int(time.time()))
        await bus.publish(other)
        async with running_ledger(fresh_nats.url, tmp_path / "ledger.sqlite") as app:
            read_model = await ReadModel.open(bus)
            now = time.time()
            assert await read_model.owner_stored_bytes(ALICE, now) == 10 + 32  # across her keys
            assert await read_model.owner_stored_bytes(LONE_OWNER, now) == 10
            assert await read_model.owner_stored_bytes("user-nobody", now) == 0
            assert await read_model.owner_file_ids_by_sha256(ALICE, SAME) == ["file-a"]
            assert await read_model.owner_file_ids_by_sha256(ALICE, "ef" * 32) == ["file-d"]
            assert await diff_against_live(bus, read_model) == []

            deleted = await bus.publish(FileDeleted(aggregate_id="file-a", owner_key_id=key_id_for_hash(PHONE)))
            await folded_through(app, deleted)
            assert await read_model.owner_stored_bytes(ALICE, now) == 32
            assert await read_model.owner_file_ids_by_sha256(ALICE, SAME) == []
            assert await diff_against_live(bus, read_model) == []
    finally:
        await bus.close()


async def test_a_file_record_put_again_is_counted_once_and_an_expired_file_not_at_all(
        fresh_nats: RunningNats) -> None:
    bus = await EventBus.connect(fresh_nats.url, "tests")
    try:
        read_model = await ReadModel.open(bus)
        now = int(time.time())

        def record(file_id: str, size: int, expires_at: int | None, deleted: bool = False) -> FileRecord:
            return file_record(file_id, size=size, expires_at=expires_at, deleted=deleted)

        for each in [record("f1", 100, now + 3600), record("f1", 100, now + 3600), record("f2", 7, now - 1),
                     record("f3", 20, None)]:
            await read_model.put(f"file.{each.file.id}", each)
        assert await read_model.owner_stored_bytes(ALICE, now) == 100 + 20  # f2 expired, not swept yet
        assert await read_model.owner_file_ids_by_sha256(ALICE, "ab" * 32) == ["f1", "f2", "f3"]

        for _ in range(2):
            await read_model.put("file.f1", record("f1", 100, now + 3600, deleted=True))
        assert await read_model.owner_stored_bytes(ALICE, now) == 20
        assert await read_model.owner_stored_bytes(ALICE, now + 7200) == 20  # f3 never expires
    finally:
        await bus.close()


async def test_a_read_model_made_before_stored_bytes_gets_them_at_the_ledgers_next_start(
        fresh_nats: RunningNats, tmp_path: Path) -> None:
    bus = await EventBus.connect(fresh_nats.url, "tests")
    db_path = tmp_path / "ledger.sqlite"
    try:
        for fact in history():
            await bus.publish(fact)
        read_model = await ReadModel.open(bus)
        ledger = Ledger(persistence_env(db_path))  # as the ledger did before stored bytes were kept
        facts = [fact async for fact in eventlog.read(bus)]
        for projection in (project(a, ledger.user_of_key) for a in ledger.fold_facts(facts)):
            if projection is not None and not isinstance(projection, KeyProjection):
                await read_model.kv.put(projection_key(projection), projection.model_dump_json().encode())
        ledger.record_checkpoint(facts[-1].sequence)
        for done in (OWNER_INDEX, LIVE_INDEX):
            ledger.tracking.insert_tracking(Tracking(application_name=done, notification_id=1))
        ledger.close()
        # Records alone (no owners' copies): no summary, and no index to count instead; what follows is the ledger's.
        assert await read_model.owner_stored_bytes(ALICE, time.time()) == 0

        async with running_ledger(fresh_nats.url, db_path) as app:
            assert app.folder is not None and app.folder.folded == 0
            assert await read_model.owner_stored_bytes(ALICE, time.time()) == 10
            assert await read_model.owner_file_ids_by_sha256(LONE_OWNER, SAME) == ["file-c"]
    finally:
        await bus.close()


async def test_a_digest_that_is_not_hex_and_a_full_part_never_stop_the_writer(
        fresh_nats: RunningNats, monkeypatch: pytest.MonkeyPatch) -> None:
    bus = await EventBus.connect(fresh_nats.url, "tests")
    try:
        read_model = await ReadModel.open(bus)
        now = int(time.time())

        def record(file_id: str, sha256: str) -> FileRecord:
            return file_record(file_id, sha256=sha256)

        for junk, file_id in [("", "f-empty"), ("a*", "f-star"), ("A.", "f-dot")]:
            await read_model.put(f"file.{file_id}", record(file_id, junk))  # no key error reaches the writer
        assert await read_model.owner_stored_bytes(ALICE, now) == 30

        monkeypatch.setattr(stored_bytes, "MAX_PART_BYTES", 400)  # about three entries
        for n in range(6):
            await read_model.put(f"file.f{n}", record(f"f{n}", "ab" * 32))
        kept = await read_model.owner_file_ids_by_sha256(ALICE, "ab" * 32)
        assert sorted(kept) == [f"f{n}" for n in range(6)], "a full part goes on in overflow parts"
        await read_model.put("file.f-other", record("f-other", "cd" * 32))
        assert await read_model.owner_file_ids_by_sha256(ALICE, "cd" * 32) == ["f-other"], "other parts go on"
        assert await read_model.get_file("f-other") is not None, "and so does every record"
    finally:
        await bus.close()


async def test_files_and_batches_of_one_owner_put_at_once_all_count_and_no_owner_keeps_a_lock(
        fresh_nats: RunningNats) -> None:
    bus = await EventBus.connect(fresh_nats.url, "tests")
    try:
        read_model = await ReadModel.open(bus)
        batches = [BatchRecord(owner_key_id="k1", owner_user_id=f"u{n % 4}", last_sequence=1, batch=Batch(
            id=f"batch_{n}", endpoint="/v1/chat/completions", input_file_id=f"f{n}", completion_window="24h",
            status="validating", created_at=int(time.time()))) for n in range(40)]

        await asyncio.gather(*(read_model.put(f"file.f{n}", file_record(f"f{n}", user=f"u{n % 4}"))
                               for n in range(40)), *(put_batch(read_model, batch) for batch in batches))

        for user in range(4):  # each owner's writes one at a time: none lost
            owner = f"user-u{user}"
            assert await read_model.owner_stored_bytes(owner, time.time()) == 10 * 10
            assert sorted(await read_model.owner_live_list(owner)) == sorted(f"batch_{n}" for n in range(user, 40, 4))
        assert len(read_model._live_locks) == len(read_model._stored._locks) == 0
    finally:
        await bus.close()


async def test_before_the_ledger_keeps_an_owners_stored_bytes_and_live_list_their_index_is_counted(
        fresh_nats: RunningNats, tmp_path: Path) -> None:
    """A read model an older ledger wrote (records and their owners' copies), as a rolling upgrade's gateway reads it
    before the upgraded ledger wrote every owner's stored bytes and live list: nothing counts as zero."""
    bus = await EventBus.connect(fresh_nats.url, "tests")
    try:
        for fact in history():  # Alice stores file-a (and file-b, deleted), batch_a reads it; the lone key alike
            await bus.publish(fact)
        read_model = await ReadModel.open(bus)
        ledger = Ledger(persistence_env(tmp_path / "ledger.sqlite"))
        facts = [fact async for fact in eventlog.read(bus)]
        for projection in (project(a, ledger.user_of_key) for a in ledger.fold_facts(facts)):
            if isinstance(projection, BatchRecord | FileRecord):
                value = projection.model_dump_json().encode()
                copy_key, kept = owner_copy(projection)
                await (read_model.kv.put(copy_key, value) if kept else read_model.kv.delete(copy_key))
                await read_model.kv.put(projection_key(projection), value)
        ledger.close()

        assert await read_model.owner_stored_bytes(ALICE, time.time()) == 10
        assert await read_model.owner_live_list(ALICE) == {"batch_a": "file-a"}
        assert await read_model.owner_stored_bytes(LONE_OWNER, time.time()) == 10
        assert await read_model.owner_live_list(LONE_OWNER) == {"batch_c": "file-c"}
        assert await read_model.owner_stored_bytes("user-nobody", time.time()) == 0
    finally:
        await bus.close()
