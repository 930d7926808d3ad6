"""An upload reserved against its owner's storage quota, read against the owner's stored bytes on a real broker: it
is counted once, whether the ledger has entered its bytes, filed its record too, or neither yet, and a deleted one
no longer at all."""

import secrets

from services.gateway.usecases.files import STORED_BYTES, quota_item, stored_holdings
from services.runtime.nats.bus import EventBus
from services.runtime.nats.kv import open_bucket
from services.runtime.nats.readmodel import ReadModel
from services.runtime.nats.stored_bytes import StoredBytesWriter
from tests.integration.test_ledger_stored_bytes import file_record

ALICE = "user-alice"
DIGEST = "ab" * 32


async def read_model_of(bus: EventBus) -> ReadModel:
    return ReadModel(await open_bucket(bus, f"read_{secrets.token_hex(4)}", scans=True))


async def test_an_upload_whose_bytes_are_entered_before_its_record_is_filed_is_counted_once(bus: EventBus) -> None:
    read_model = await read_model_of(bus)
    await StoredBytesWriter(read_model.kv).enter(file_record("f1", size=100, sha256=DIGEST))  # no record yet
    reserved = quota_item("f1", DIGEST)

    held = await stored_holdings(read_model, ALICE)(frozenset({reserved}))

    assert held.counted == {STORED_BYTES: 100}
    assert held.known == {reserved}  # in the bytes: not pending as well


async def test_an_upload_not_entered_yet_stays_pending_and_a_filed_one_is_in_the_bytes(bus: EventBus) -> None:
    read_model = await read_model_of(bus)
    filed = file_record("f1", size=100, sha256=DIGEST)
    await read_model.put("file.f1", filed)  # the ledger's put: bytes first, then the record
    waiting = quota_item("f2", "cd" * 32)

    held = await stored_holdings(read_model, ALICE)(frozenset({quota_item("f1", DIGEST), waiting}))

    assert held.counted == {STORED_BYTES: 100}
    assert held.known == {quota_item("f1", DIGEST)}


async def test_a_deleted_upload_is_known_and_counted_nowhere(bus: EventBus) -> None:
    read_model = await read_model_of(bus)
    await read_model.put("file.f1", file_record("f1", size=100, sha256=DIGEST))
    await read_model.put("file.f1", file_record("f1", size=100, sha256=DIGEST, deleted=True))
    reserved = quota_item("f1", DIGEST)

    held = await stored_holdings(read_model, ALICE)(frozenset({reserved}))

    assert held.counted == {STORED_BYTES: 0}
    assert held.known == {reserved}


async def test_an_older_gateways_reservation_of_a_bare_id_is_known_once_its_record_shows(bus: EventBus) -> None:
    read_model = await read_model_of(bus)
    await read_model.put("file.f1", file_record("f1", size=100, sha256=DIGEST))

    held = await stored_holdings(read_model, ALICE)(frozenset({"f1", "f9"}))

    assert held.counted == {STORED_BYTES: 100}
    assert held.known == {"f1"}
