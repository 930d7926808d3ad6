"""Streams and KV buckets on a real 3-node JetStream cluster: made with the configured replicas, scaled up when found
with fewer, read back with every acknowledged write in them (what a limit counts: from the stream's leader; a record
a replica does not show: from the leader too, before it is called missing), and, with no leader to ask, refused fast
rather than answered by a replica that may lag; a single broker refuses replicas outright."""

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats.errors
import nats.js.errors
import pytest

from contracts.api.batch import Batch
from contracts.events.batch import LineRejected
from contracts.readmodel import BatchRecord
from contracts.subjects import EVENTS_STREAM, WORK_STREAM, event_subject
from infra.nats_cluster import NatsCluster
from services.runtime.nats.bus import EventBus
from services.runtime.nats.kv import LEADER_TIMEOUT_S, ScanFailed, latest_entries, open_bucket, read_page, read_subject
from services.runtime.nats.readmodel import ReadModel
from tests.conftest import RunningNats
from tests.integration.test_kv_scans import api_requests
from tests.integration.test_ledger_stored_bytes import file_record
from tests.support import put_batch

NOT_CLUSTERED = 10074
"""JetStream's error code for replicas > 1 on a server that is not in a cluster."""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    running = NatsCluster.plan(tmp_path / "data")
    running.start()
    yield running
    running.stop()


@pytest.fixture
async def bus(cluster: NatsCluster) -> AsyncIterator[EventBus]:
    bus = await EventBus.connect(cluster.core_urls(), "tests", replicas=3)
    yield bus
    await bus.close()


async def elected(bus: EventBus, stream: str, within_s: float = 60.0) -> str:
    """The stream's leader, once it has one."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            leader = (await bus.js.stream_info(stream)).cluster.leader  # type: ignore[union-attr]
        except (nats.errors.TimeoutError, nats.js.errors.APIError):  # asked before a leader could answer
            leader = None
        if leader is not None:
            return leader
        assert time.monotonic() < deadline, f"{stream} elected no leader within {within_s:.0f} s"
        await asyncio.sleep(0.1)


async def replicas(bus: EventBus, stream: str) -> int:
    return (await bus.js.stream_info(stream)).config.num_replicas or 1


def rejected(batch_id: str, line: int) -> LineRejected:
    return LineRejected(aggregate_id=batch_id, line=line, code="invalid_json", message="not JSON", kept=True)


async def test_every_stream_and_bucket_is_made_with_the_configured_replicas(bus: EventBus) -> None:
    kv = await open_bucket(bus, f"r3_{secrets.token_hex(4)}", 30.0, scans=True)

    assert [await replicas(bus, stream) for stream in (EVENTS_STREAM, WORK_STREAM, kv.stream)] == [3, 3, 3]


async def test_a_stream_and_a_bucket_made_with_one_replica_are_scaled_up_and_never_down(cluster: NatsCluster) -> None:
    bucket = f"old_{secrets.token_hex(4)}"
    single = await EventBus.connect(cluster.core_urls(), "tests", replicas=1)
    await open_bucket(single, bucket)
    assert await replicas(single, EVENTS_STREAM) == 1

    clustered = await EventBus.connect(cluster.core_urls(), "tests", replicas=3)
    kv = await open_bucket(clustered, bucket)
    await EventBus.connect(cluster.core_urls(), "tests", replicas=1)  # a process still configured for one

    assert [await replicas(clustered, stream) for stream in (EVENTS_STREAM, WORK_STREAM, kv.stream)] == [3, 3, 3]
    await single.close()
    await clustered.close()


async def test_a_read_right_after_each_acknowledged_write_holds_it(bus: EventBus) -> None:
    batch_id = f"batch_{secrets.token_hex(6)}"
    subject = event_subject("batch", batch_id, LineRejected.name)
    kv = await open_bucket(bus, f"raw_{secrets.token_hex(4)}", scans=True)
    for line in range(1, 41):
        sequence = await bus.publish(rejected(batch_id, line))
        await kv.put(f"k.{line}", str(line).encode())

        page, _ = await read_page(bus.js, EVENTS_STREAM, subject, 0, 1000, 1 << 20)
        assert page[-1].seq == sequence
        assert (await read_subject(bus.js, EVENTS_STREAM, subject))[-1].seq == sequence
        assert len(await latest_entries(kv, "k.>")) == line


async def test_an_owners_batches_read_right_after_each_acknowledged_write_hold_it(bus: EventBus) -> None:
    read_model = ReadModel(await open_bucket(bus, f"read_{secrets.token_hex(4)}", scans=True))
    for n in range(1, 21):
        batch = Batch(id=f"batch_{n}", endpoint="/v1/chat/completions", input_file_id="f1", completion_window="24h",
                      status="validating", created_at=int(time.time()))
        await put_batch(read_model, BatchRecord(owner_key_id="k1", owner_user_id="alice", batch=batch, last_sequence=n))
        assert len(await read_model.owner_batches("user-alice")) == n


async def test_what_the_owners_limits_count_is_read_from_the_leader_never_from_a_replica_that_may_lag(
        bus: EventBus) -> None:
    read_model = ReadModel(await open_bucket(bus, f"read_{secrets.token_hex(4)}", scans=True))
    stream = read_model.kv.stream
    batch = Batch(id="batch_1", endpoint="/v1/chat/completions", input_file_id="f1", completion_window="24h",
                  status="validating", created_at=int(time.time()))
    await put_batch(read_model, BatchRecord(owner_key_id="k1", owner_user_id="alice", batch=batch, last_sequence=1))
    await read_model.put("file.f1", file_record("f1", size=100))
    assert await read_model.owner_stored_bytes("user-alice", time.time()) == 100  # the replicas asked once
    asked = await api_requests(bus, stream)

    assert await read_model.owner_live_list("user-alice") == {"batch_1": "f1"}
    assert await read_model.owner_stored_bytes("user-alice", time.time()) == 100
    assert await read_model.owner_file_ids_by_sha256("user-alice", "ab" * 32) == ["f1"]
    await bus.nc.flush()
    assert asked == {"leader": 3}


async def test_a_record_no_replica_shows_is_asked_of_the_leader_before_it_is_called_missing(bus: EventBus) -> None:
    """A direct get may be answered by a replica a commit behind, or catching up after a restart: its miss is not
    the last word (a user would get a 404 for a file that exists). What it finds is taken as it is."""
    read_model = ReadModel(await open_bucket(bus, f"read_{secrets.token_hex(4)}", scans=True))
    await read_model.put("file.f1", file_record("f1", size=100))
    assert await read_model.get_file("f0") is None  # the replicas asked once, and kept a while
    asked = await api_requests(bus, read_model.kv.stream)

    found, missing = await read_model.get_file("f1"), await read_model.get_file("f2")

    await bus.nc.flush()
    assert (found.file.id if found else None, missing) == ("f1", None)
    assert asked == {"direct": 2, "leader": 1}


async def test_with_no_leader_a_coherent_read_is_refused_fast_and_a_heartbeat_read_still_answers(
        cluster: NatsCluster, bus: EventBus) -> None:
    kv = await open_bucket(bus, f"lost_{secrets.token_hex(4)}", scans=True)
    leader = await elected(bus, kv.stream)  # a loaded host may take a while to elect a new stream's leader
    await kv.put("executor.a", b"alive")
    survivor, *others = sorted((node.name for node in cluster.nodes), key=lambda name: name == leader)
    for name in others:  # its leader and one more: no quorum, so no leader
        cluster.kill(name)
    await asyncio.sleep(0.5)  # the client moves to the survivor

    started = time.monotonic()
    with pytest.raises(ScanFailed):
        await latest_entries(kv, ">")
    assert time.monotonic() - started < LEADER_TIMEOUT_S + 3
    assert await latest_entries(kv, ">", coherent=False) == [("executor.a", b"alive")]
    assert bus.nc.connected_url is not None and bus.nc.connected_url.port == cluster.node(survivor).client_port


async def test_a_single_broker_refuses_replicated_streams_with_the_reason(fresh_nats: RunningNats) -> None:
    with pytest.raises(nats.js.errors.APIError) as refused:
        await EventBus.connect(fresh_nats.url, "tests", replicas=3)

    assert refused.value.err_code == NOT_CLUSTERED
