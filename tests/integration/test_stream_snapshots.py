"""A stream snapshotted on one broker and restored on another keeps every message at its sequence (gaps
included), its headers and its durable consumers' positions; a stream that exists is never restored over."""

from pathlib import Path

import nats
import pytest

from infra import stream_snapshots
from infra.embedded import free_port, start_nats, stop_process
from tests.conftest import RunningNats


async def test_a_restored_stream_keeps_sequences_gaps_headers_and_consumer_positions(
        fresh_nats: RunningNats, tmp_path: Path) -> None:
    source = await nats.connect(fresh_nats.url)
    js = source.jetstream()
    await js.add_stream(name="LOG", subjects=["log.>"])
    for i in range(1, 301):
        await js.publish(f"log.{i % 3}", f"fact {i}".encode(), headers={"Nats-Msg-Id": f"fact-{i}"})
    await js.delete_msg("LOG", 7)
    consumer = await js.pull_subscribe("log.>", durable="reader", stream="LOG")
    for msg in await consumer.fetch(10):
        await msg.ack_sync()  # acknowledged by the broker before the snapshot, not in flight
    taken = await stream_snapshots.snapshot(source, "LOG", tmp_path / "LOG.snapshot")
    await source.close()

    other = tmp_path / "other"
    other.mkdir()
    port = free_port()
    process = start_nats(other, port, other / "nats.log")
    try:
        target = await nats.connect(f"nats://127.0.0.1:{port}")
        assert not await stream_snapshots.exists(target, "LOG")
        state = await stream_snapshots.restore(target, "LOG", taken.path, taken.config, taken.state, replicas=1)
        assert (state["messages"], state["last_seq"], state["num_deleted"]) == (299, 300, 1)
        restored = target.jetstream()
        message = await restored.get_msg("LOG", 8)
        assert (message.data, message.headers) == (b"fact 8", {"Nats-Msg-Id": "fact-8"})
        reader = await restored.consumer_info("LOG", "reader")
        assert (reader.ack_floor.stream_seq, reader.num_pending) == (11, 289)
        with pytest.raises(stream_snapshots.SnapshotFailed, match="already in use"):
            await stream_snapshots.restore(target, "LOG", taken.path, taken.config, taken.state, replicas=1)
        await target.close()
    finally:
        stop_process(process)
