"""The ledger reads a backlog far larger than the client buffers without losing, repeating or stalling on a fact."""

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from nats.aio.subscription import Subscription

from contracts.events.envelope import Event
from contracts.readmodel import BatchRecord
from contracts.subjects import EVENTS_STREAM
from services.ledger.replay import replay_into_scratch
from services.runtime.nats.bus import EventBus
from services.runtime.nats.follower import OrderedReader
from tests.conftest import RunningNats
from tests.factories import batch_life

BATCHES, CHUNKS = 30, 995
"""30 batches of 1,000 facts each: 30,000 facts, six times the client buffer below."""
CLIENT_BUFFER = 5_000
WAIT_S = 120.0


def life(n: int) -> list[Event]:
    return batch_life(f"batch_backlog{n:03d}", CHUNKS, owner_key_id="key_b", input_file_id=f"file-{n}",
                      output_file_id=f"out-{n}", finalizing=False)


@pytest.fixture
async def backlog(fresh_nats: RunningNats, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[EventBus, int]]:
    """A broker whose stream holds 30,000 interleaved facts, and a client whose subscriptions buffer 5,000."""
    bus = await EventBus.connect(fresh_nats.url, "tests")
    lives = [life(n) for n in range(BATCHES)]
    facts = [fact for step in zip(*lives, strict=True) for fact in step]
    for start in range(0, len(facts), 2000):
        await asyncio.gather(*(bus.js.publish(f.subject, f.model_dump_json().encode(), stream=EVENTS_STREAM)
                               for f in facts[start:start + 2000]))
    subscribe = bus.nc.subscribe

    async def small_buffered(*args: Any, **kwargs: Any) -> Subscription:
        return await subscribe(*args, **{**kwargs, "pending_msgs_limit": CLIENT_BUFFER})

    monkeypatch.setattr(bus.nc, "subscribe", small_buffered)
    yield bus, len(facts)
    await bus.close()


async def test_a_backlog_six_times_the_client_buffer_is_replayed_whole_and_in_order(
    backlog: tuple[EventBus, int],
) -> None:
    bus, head = backlog
    replayed = await asyncio.wait_for(replay_into_scratch(bus), WAIT_S)
    assert replayed.events == head
    # The owner's index holds a copy of each record (`owner.<owner>.batch.<id>`): count the records themselves.
    batches = [r for key, r in replayed.records.items() if isinstance(r, BatchRecord) and key.startswith("batch.")]
    assert len(batches) == BATCHES
    assert {(r.batch.status, r.batch.request_counts.completed) for r in batches} == {("completed", CHUNKS)}
    assert max(r.last_sequence for r in batches) == head


async def test_the_reader_resumes_after_the_last_fact_it_handed_on_when_its_consumer_is_deleted(
    backlog: tuple[EventBus, int],
) -> None:
    bus, head = backlog
    reader = OrderedReader(bus, start_after=0, batch=500)
    sequences: list[int] = []

    async def read_to_the_head() -> None:
        async for facts in reader.groups():
            sequences.extend(fact.sequence for fact in facts)
            if len(sequences) == 1000:
                await bus.js.delete_consumer(EVENTS_STREAM, reader.consumer)
            if sequences[-1] >= head:
                return

    try:
        await asyncio.wait_for(read_to_the_head(), WAIT_S)
    finally:
        await reader.close()
    assert sequences == list(range(1, head + 1))
