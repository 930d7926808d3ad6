"""An ended batch whose log the ledger archived and purged from the stream still streams its events (SSE), from
its archived log, resumable as before."""

from collections.abc import AsyncIterator

import pytest

from contracts.subjects import batch_events
from services.ledger.archive import Archive
from services.ledger.retention import purge_batch
from services.runtime.nats import eventlog
from services.runtime.process.settings import ConnectionSettings
from services.runtime.storage.objectstore import ObjectStore
from tests.integration.gateway_support import Gateway, running_gateway
from tests.integration.test_gateway_events import finished_batch, frames, read_stream


@pytest.fixture(scope="module")
async def gateway(connection: ConnectionSettings) -> AsyncIterator[Gateway]:
    async with running_gateway(connection) as running:
        yield running


async def test_an_archived_batch_streams_its_events_from_its_archived_log(gateway: Gateway,
                                                                          object_store: ObjectStore) -> None:
    key = await gateway.new_key()
    batch_id = await finished_batch(gateway, key, "archived")
    shown = frames(await read_stream(gateway, batch_id, key))
    assert await purge_batch(gateway.bus, Archive(object_store), batch_id, await eventlog.head(gateway.bus))
    assert [fact async for fact in eventlog.read(gateway.bus, batch_events(batch_id))] == []

    assert frames(await read_stream(gateway, batch_id, key)) == shown
    assert frames(await read_stream(gateway, batch_id, {**key, "Last-Event-ID": shown[0]["id"]})) == shown[1:]
    assert frames(await read_stream(gateway, batch_id, {**key, "Last-Event-ID": shown[-1]["id"]})) == []
