"""The log's head is its last fact, also after retention purged the newest facts by subject (the stream's
`last_seq` stays where it was): a ledger started then catches up, instead of waiting for a fact that is gone."""

import asyncio
from pathlib import Path

from contracts.events.batch import BatchCreated
from services.runtime.nats import eventlog
from services.runtime.nats.bus import EventBus
from tests.conftest import RunningNats
from tests.factories import batch_created
from tests.integration.test_ledger_rebuild import running_ledger


def created(batch_id: str) -> BatchCreated:
    return batch_created(batch_id, "key_head", f"files/file-{batch_id}", created_at=1, expires_at=2)


async def test_a_ledger_catches_up_with_a_stream_whose_newest_facts_were_purged(
        fresh_nats: RunningNats, tmp_path: Path) -> None:
    bus = await EventBus.connect(fresh_nats.url, "tests-head")
    try:
        assert await eventlog.head(bus) == 0, "an empty stream"
        kept = await bus.publish(created("batch_kept"))
        await bus.publish(created("batch_purged"))
        assert await eventlog.head(bus) == kept + 1
        await bus.js.purge_stream("EVENTS", subject="evt.batch.batch_purged.>")
        assert (await bus.js.stream_info("EVENTS")).state.last_seq == kept + 1, "the stream's own last sequence"
        assert await eventlog.head(bus) == kept, "the last fact it holds"

        async with running_ledger(fresh_nats.url, tmp_path / "ledger.sqlite") as app:  # waits for caught_up
            assert app.caught_up.is_set()
        assert [fact.sequence async for fact in eventlog.read(bus)] == [kept]
    finally:
        await bus.close()


async def test_the_head_of_a_stream_with_a_gap_inside_is_still_its_last_fact(fresh_nats: RunningNats) -> None:
    bus = await EventBus.connect(fresh_nats.url, "tests-head")
    try:
        await bus.publish(created("batch_first"))
        await bus.publish(created("batch_gone"))
        last = await bus.publish(created("batch_last"))
        await bus.js.purge_stream("EVENTS", subject="evt.batch.batch_gone.>")
        assert await asyncio.wait_for(eventlog.head(bus), 10) == last
    finally:
        await bus.close()
