"""An owner's index of batches against a real broker: each batch filed once (its id and creation time), however
often its record changes; an index an older ledger wrote (whole records, stale by now) lists the current records;
an entry whose record is not readable yet, or is another owner's, is left out of the owner's list."""

from contracts.api.batch import Batch, BatchStatus
from contracts.readmodel import BatchRecord
from contracts.subjects import owner_index_key
from services.gateway.usecases.batch_list import batch_page, indexed
from services.runtime.nats.bus import EventBus
from services.runtime.nats.read_entries import BatchIndexEntry, owner_copy
from services.runtime.nats.readmodel import ReadModel
from tests.conftest import RunningNats
from tests.support import put_batch

T0 = 1_700_000_000
OWNER = "key-alone"


def record(batch_id: str, status: BatchStatus, created_at: int = T0, owner_key_id: str = "alone") -> BatchRecord:
    batch = Batch(id=batch_id, endpoint="/v1/chat/completions", input_file_id="file-in", completion_window="24h",
                  status=status, created_at=created_at)
    return BatchRecord(owner_key_id=owner_key_id, batch=batch, last_sequence=1)


async def revision(read_model: ReadModel, key: str) -> int:
    return (await read_model.kv.get(key)).revision or 0


async def test_a_batch_is_filed_in_its_owners_index_once_however_often_its_record_changes(
        fresh_nats: RunningNats) -> None:
    bus = await EventBus.connect(fresh_nats.url, "tests")
    try:
        writer = await ReadModel.open(bus)
        index_key, _ = owner_copy(record("batch_a", "validating"))
        await put_batch(writer, record("batch_a", "validating"))
        filed = await revision(writer, index_key)
        for status in ("in_progress", "finalizing", "completed", "completed"):
            await put_batch(writer, record("batch_a", status))
        restarted = await ReadModel.open(bus)  # a new writer knows a live batch is filed from the live list
        await put_batch(restarted, record("batch_b", "validating", T0 + 1))
        filed_b = await revision(restarted, owner_index_key(OWNER, "batch", "batch_b"))
        await put_batch(ReadModel(restarted.kv), record("batch_b", "in_progress", T0 + 1))

        assert await revision(writer, index_key) == filed
        assert await revision(restarted, owner_index_key(OWNER, "batch", "batch_b")) == filed_b
        assert await writer.owner_batch_index(OWNER) == [BatchIndexEntry(id="batch_a", created_at=T0),
                                                         BatchIndexEntry(id="batch_b", created_at=T0 + 1)]
        assert [(r.batch.id, r.batch.status) for r in await writer.owner_batches(OWNER)] == [
            ("batch_a", "completed"), ("batch_b", "in_progress")]
    finally:
        await bus.close()


async def test_an_index_an_older_ledger_wrote_lists_the_current_records(fresh_nats: RunningNats) -> None:
    bus = await EventBus.connect(fresh_nats.url, "tests")
    try:
        read_model = await ReadModel.open(bus)
        for n in range(3):  # as an older ledger left them: a whole (and by now stale) record at the owner's key
            old = record(f"batch_{n}", "in_progress", T0 + n)
            await read_model.kv.put(owner_copy(old)[0], old.model_dump_json().encode())
            await read_model.kv.put(f"batch.batch_{n}", record(f"batch_{n}", "completed", T0 + n).model_dump_json()
                                    .encode())

        page = await batch_page(indexed(read_model, {OWNER: await read_model.owner_batch_index(OWNER)}), None, 2)

        assert [(b.id, b.status) for b in page.data] == [("batch_2", "completed"), ("batch_1", "completed")]
        assert page.has_more
        assert [r.batch.status for r in await read_model.owner_batches(OWNER)] == ["completed"] * 3
    finally:
        await bus.close()


async def test_an_entry_whose_record_is_not_there_yet_or_is_another_owners_is_left_out(
        fresh_nats: RunningNats) -> None:
    bus = await EventBus.connect(fresh_nats.url, "tests")
    try:
        read_model = await ReadModel.open(bus)
        await put_batch(read_model, record("batch_mine", "completed"))
        await put_batch(read_model, record("batch_theirs", "completed", owner_key_id="other"))
        for batch_id in ("batch_coming", "batch_theirs"):
            entry = BatchIndexEntry(id=batch_id, created_at=T0 + 5)
            await read_model.kv.put(owner_index_key(OWNER, "batch", batch_id), entry.model_dump_json().encode())

        page = await batch_page(indexed(read_model, {OWNER: await read_model.owner_batch_index(OWNER)}), None, 20)

        assert [b.id for b in page.data] == ["batch_mine"] and not page.has_more
        assert [r.batch.id for r in await read_model.owner_batches(OWNER)] == ["batch_mine"]
    finally:
        await bus.close()
