"""A read-model value that is no record (the broker's own answer, written on a key an executor's JetStream request
named as its reply subject) reads as absent and is written over: no tenant's reads, lists or quota checks fail on it,
and the ledger's writes go on."""

import time

from contracts.subjects import owner_index_key, owner_live_key, owner_stored_key, read_model_key
from services.runtime.nats.bus import EventBus
from services.runtime.nats.readmodel import ReadModel
from tests.conftest import RunningNats
from tests.integration.test_ledger_owner_index import ALICE
from tests.integration.test_ledger_stored_bytes import file_record

JUNK = b'{"stream":"KV_sheshnag_executors","seq":7}'


async def test_junk_in_the_read_model_reads_as_absent_and_is_written_over(fresh_nats: RunningNats) -> None:
    bus = await EventBus.connect(fresh_nats.url, "tests")
    try:
        read_model = await ReadModel.open(bus)
        await read_model.put(read_model_key("file", "f1"), file_record("f1", size=10))
        for key in (read_model_key("file", "f1"), owner_stored_key(ALICE), owner_live_key(ALICE),
                    owner_index_key(ALICE, "file", "f-junk"), read_model_key("batch", "batch_junk")):
            await read_model.kv.put(key, JUNK)
        assert await read_model.get_file("f1") is None
        assert await read_model.get_batch("batch_junk") is None
        assert [r.file.id for r in await read_model.owner_files(ALICE)] == ["f1"]
        await read_model.owner_stored_bytes(ALICE, time.time())  # answers, whatever it counts
        await read_model.put(read_model_key("file", "f2"), file_record("f2", size=20, sha256="cd" * 32))
        assert await read_model.get_file("f2") is not None, "the ledger's writes go on over the junk"
        assert await read_model.owner_live_list(ALICE) is not None
    finally:
        await bus.close()
