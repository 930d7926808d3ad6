"""The one log reader against the real nats-server: to the head as it was when reading began, or live."""

import asyncio
from contextlib import aclosing
from datetime import UTC, datetime

from contracts.events.batch import BatchReleased, LineRejected
from contracts.ids import new_batch_id
from contracts.subjects import batch_events, batch_fact
from services.runtime.nats import eventlog
from services.runtime.nats.bus import EventBus


def rejected(batch_id: str, line: int) -> LineRejected:
    return LineRejected(aggregate_id=batch_id, line=line, code="invalid_json", message="not JSON")


async def test_a_read_ends_at_the_head_as_it_was_when_reading_began(bus: EventBus) -> None:
    batch_id = new_batch_id()
    sequences = [await bus.publish(rejected(batch_id, line)) for line in range(1, 4)]
    read: list[int] = []
    async for fact in eventlog.read(bus, batch_events(batch_id)):
        read.append(fact.sequence)
        await bus.publish(rejected(batch_id, 100 + len(read)))  # published after the read began: the next read's
    assert read == sequences


async def test_a_read_of_a_filter_nothing_matches_ends_at_once(bus: EventBus) -> None:
    await bus.publish(rejected(new_batch_id(), 1))
    async with asyncio.timeout(2):
        assert [fact async for fact in eventlog.read(bus, batch_events(new_batch_id()))] == []


async def test_a_read_from_a_sequence_or_a_time_starts_there_and_says_when_each_fact_was_stored(
        bus: EventBus) -> None:
    batch_id = new_batch_id()
    first = await bus.publish(rejected(batch_id, 1))
    await asyncio.sleep(0.05)
    between = datetime.now(UTC)
    await asyncio.sleep(0.05)
    second = await bus.publish(rejected(batch_id, 2))
    assert [f.sequence async for f in eventlog.read(bus, batch_events(batch_id), after=first)] == [second]
    since = [f async for f in eventlog.read(bus, batch_events(batch_id), since=between)]
    assert [f.sequence for f in since] == [second]
    stored = eventlog.published_at(since[0])
    assert stored is not None and between <= stored <= datetime.now(UTC)


async def test_following_hands_on_the_facts_there_and_each_one_published_later_in_order(bus: EventBus) -> None:
    batch_id = new_batch_id()
    before = await bus.publish(rejected(batch_id, 1))
    seen: list[int] = []
    async with asyncio.timeout(10), aclosing(eventlog.follow(bus, batch_events(batch_id))) as log:
        async for facts in log:
            seen += [fact.sequence for fact in facts]
            if len(seen) == 1:
                later = [await bus.publish(rejected(batch_id, line)) for line in (2, 3)]
            if len(seen) == 3:
                break
    assert seen == [before, *later]


async def test_following_several_filters_hands_on_only_their_facts_and_their_head_is_their_last_fact(
        bus: EventBus) -> None:
    batch_id, other = new_batch_id(), new_batch_id()
    subjects = (batch_fact(batch_id, "line_rejected"), batch_fact(other, "line_rejected"))
    wanted = [await bus.publish(rejected(batch_id, 1))]
    await bus.publish(BatchReleased(aggregate_id=batch_id, released_by_key_id="key_a"))  # not on the filters
    wanted.append(await bus.publish(rejected(other, 1)))
    await bus.publish(rejected(new_batch_id(), 1))  # nor this one, the stream's last fact
    assert await eventlog.head(bus, subjects) == wanted[-1] < await eventlog.head(bus)
    assert await eventlog.head(bus, (batch_fact(new_batch_id(), "created"),)) == 0
    seen: list[int] = []
    async with asyncio.timeout(10), aclosing(eventlog.follow(bus, subjects)) as log:
        async for facts in log:
            seen += [fact.sequence for fact in facts]
            if len(seen) == 2:
                wanted.append(await bus.publish(rejected(batch_id, 2)))
            if len(seen) == 3:
                break
    assert seen == wanted
