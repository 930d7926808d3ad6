"""The shared adapters against the real broker and the real S3 server."""

import asyncio

from nats.js.api import DeliverPolicy

from contracts.events.batch import LineRejected
from contracts.subjects import EVENTS_STREAM, batch_events
from services.runtime.bus import EventBus
from services.runtime.objectstore import ObjectStore


async def test_the_same_fact_published_twice_is_stored_once(bus: EventBus) -> None:
    event = LineRejected(aggregate_id="batch_dedup1", line=4, code="invalid_json", message="not JSON")
    first = await bus.publish(event)
    again = await bus.publish(LineRejected(aggregate_id="batch_dedup1", line=4, code="invalid_json",
                                           message="not JSON"))
    assert first == again
    received: list[int] = []
    sub = await bus.js.subscribe(batch_events("batch_dedup1"), ordered_consumer=True,
                                 deliver_policy=DeliverPolicy.ALL)
    message = await sub.next_msg(timeout=2)
    received.append(message.metadata.sequence.stream)
    assert message.metadata.num_pending == 0
    await sub.unsubscribe()
    assert received == [first]


async def test_objects_stream_back_line_by_line(object_store: ObjectStore) -> None:
    body = b"".join(f'{{"n": {i}}}\n'.encode() for i in range(5000)) + b"last-without-newline"
    await object_store.put_bytes("tests/lines.jsonl", body)
    lines = [line async for line in object_store.iter_lines("tests/lines.jsonl")]
    assert len(lines) == 5001
    assert lines[0] == b'{"n": 0}' and lines[-1] == b"last-without-newline"


async def test_streams_are_declared_once_by_every_service(bus: EventBus) -> None:
    await asyncio.gather(bus.ensure_streams(), bus.ensure_streams())
    info = await bus.js.stream_info(EVENTS_STREAM)
    assert info.config.duplicate_window and info.config.duplicate_window >= 3600
