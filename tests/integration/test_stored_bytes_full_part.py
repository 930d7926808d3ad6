"""A tenant chooses its files' digests (one byte of content tried ~256 times puts a file in any part): once one part of
its stored files is full, every further file of that part must still count against its storage quota."""

import time

import pytest

from services.runtime.nats import stored_bytes
from services.runtime.nats.bus import EventBus
from services.runtime.nats.readmodel import ReadModel
from tests.conftest import RunningNats
from tests.integration.test_ledger_owner_index import ALICE
from tests.integration.test_ledger_stored_bytes import file_record


async def test_files_past_a_full_part_still_count_in_the_owners_stored_bytes(
        fresh_nats: RunningNats, monkeypatch: pytest.MonkeyPatch) -> None:
    bus = await EventBus.connect(fresh_nats.url, "tests")
    try:
        read_model = await ReadModel.open(bus)
        monkeypatch.setattr(stored_bytes, "MAX_PART_BYTES", 400)  # about three entries
        for n in range(8):
            await read_model.put(f"file.f{n}", file_record(f"f{n}", size=1000, sha256="ab" * 32))
        assert await read_model.owner_stored_bytes(ALICE, time.time()) == 8 * 1000
        for n in range(8):
            await read_model.put(f"file.f{n}", file_record(f"f{n}", size=1000, sha256="ab" * 32, deleted=True))
        assert await read_model.owner_stored_bytes(ALICE, time.time()) == 0
    finally:
        await bus.close()


async def test_a_file_in_an_overflow_part_is_counted_as_its_parts_own(
        fresh_nats: RunningNats, monkeypatch: pytest.MonkeyPatch) -> None:
    """The gateway's quota check asks which files of a digest's part are in the total: one gone on in an overflow
    part is (else it would count twice, as stored and as still pending)."""
    bus = await EventBus.connect(fresh_nats.url, "tests")
    try:
        read_model = await ReadModel.open(bus)
        monkeypatch.setattr(stored_bytes, "MAX_PART_BYTES", 400)
        for n in range(8):
            await read_model.put(f"file.f{n}", file_record(f"f{n}", size=1000, sha256="ab" * 32))
        total, counted = await read_model.owner_stored_files(ALICE, ["ab"], time.time())
        assert total == 8000 and counted["ab"] == frozenset(f"f{n}" for n in range(8))
    finally:
        await bus.close()


async def test_a_file_in_an_overflow_part_is_found_by_its_bytes(
        fresh_nats: RunningNats, monkeypatch: pytest.MonkeyPatch) -> None:
    """An upload of the same bytes again finds it (deduplicated), wherever in the part's chain it went."""
    bus = await EventBus.connect(fresh_nats.url, "tests")
    try:
        read_model = await ReadModel.open(bus)
        monkeypatch.setattr(stored_bytes, "MAX_PART_BYTES", 400)
        for n in range(8):
            await read_model.put(f"file.f{n}", file_record(f"f{n}", size=1000, sha256="ab" * 31 + f"{n:02d}"))
        assert await read_model.owner_file_ids_by_sha256(ALICE, "ab" * 31 + "07") == ["f7"]
    finally:
        await bus.close()


def test_a_replay_splits_a_full_part_within_the_part_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stored_bytes, "MAX_PART_BYTES", 4000)
    records = [file_record(f"f{n:04d}", size=10, sha256="ab" * 32) for n in range(300)]
    made = stored_bytes.stored_records(records)
    parts = [record for record in made.values() if isinstance(record, stored_bytes.StoredFiles)]
    assert sum(len(part.root) for part in parts) == 300 and len(parts) > 1
    assert all(len(part.model_dump_json()) <= stored_bytes.MAX_PART_BYTES for part in parts)
