"""Listing a KV bucket against the real broker: complete every time, and nothing left behind on the server; a value
a limit counts read from a single-replica bucket by one direct get, as any other; named keys read a few hundred a
request."""

import asyncio
import secrets
from collections import Counter

from nats.aio.msg import Msg

from contracts.events.batch import LineRejected
from contracts.subjects import EVENTS_STREAM, JS_API, direct_get, event_subject
from services.runtime.nats.bus import EventBus
from services.runtime.nats.kv import (
    LAST_PER_REQUEST,
    SCAN_PAGE,
    Bucket,
    ensure_direct_reads,
    latest_entries,
    open_bucket,
    read_last,
    read_latest,
    read_subject,
    read_value,
)


async def _bucket(bus: EventBus, scans: bool = True) -> Bucket:
    return await open_bucket(bus, f"scan_{secrets.token_hex(4)}", scans=scans)


async def api_requests(bus: EventBus, stream: str) -> Counter[str]:
    """The requests about `stream` JetStream's API gets from now on, by kind: `direct` gets (any replica may answer),
    `leader` gets, and stream `info`."""
    asked: Counter[str] = Counter()

    async def count(message: Msg) -> None:
        asked["direct" if message.subject.startswith(direct_get(stream)) else
              "leader" if ".STREAM.MSG.GET." in message.subject else "info"] += 1

    for subject in (direct_get(stream), f"{direct_get(stream)}.>", f"{JS_API}.STREAM.MSG.GET.{stream}",
                    f"{JS_API}.STREAM.INFO.{stream}"):
        await bus.nc.subscribe(subject, cb=count)
    await bus.nc.flush()
    return asked


async def test_a_value_on_a_single_replica_bucket_is_read_by_one_direct_get(bus: EventBus) -> None:
    kv = await _bucket(bus)
    await kv.put("owner.a.live", b"{}")
    await kv.put("owner.b.live", b"{}")
    await kv.delete("owner.b.live")
    assert await read_value(kv, "owner.a.live") == b"{}"  # the bucket's replicas asked once, and kept a while
    asked = await api_requests(bus, kv.stream)

    assert [await read_value(kv, f"owner.{owner}.live") for owner in "aaabc"] == [b"{}"] * 3 + [None] * 2
    await bus.nc.flush()
    assert asked == {"direct": 5}


async def test_a_key_is_read_by_one_direct_get_on_a_single_replica_bucket_found_or_not(bus: EventBus) -> None:
    kv = await _bucket(bus)
    await kv.put("file.f1", b"{}")
    assert await read_latest(kv, "file.f0") is None  # the bucket's replicas asked once, and kept a while
    asked = await api_requests(bus, kv.stream)

    assert [await read_latest(kv, key) for key in ("file.f1", "file.f2")] == [b"{}", None]
    await bus.nc.flush()
    assert asked == {"direct": 2}


async def test_a_scan_returns_every_live_key_across_many_pages_and_skips_deleted_ones(bus: EventBus) -> None:
    kv = await _bucket(bus)
    count = SCAN_PAGE * 3 + 7
    await asyncio.gather(*(kv.put(f"owner.a.batch.b{i:05d}", f"{i}".encode()) for i in range(count)))
    await kv.put("owner.b.batch.other", b"not mine")
    await kv.delete("owner.a.batch.b00003")
    await kv.put("owner.a.batch.b00010", b"rewritten")

    entries = dict(await latest_entries(kv, "owner.a.batch.>"))

    assert len(entries) == count - 1
    assert "owner.a.batch.b00003" not in entries and "owner.b.batch.other" not in entries
    assert entries["owner.a.batch.b00010"] == b"rewritten"
    assert await latest_entries(kv, "owner.nobody.>") == []


async def test_a_thousand_scans_leave_no_consumer_and_no_subscription_behind(bus: EventBus) -> None:
    kv = await _bucket(bus)
    await kv.put("owner.a.file.f1", b"1")
    subscriptions_before = len(bus.nc._subs)

    results = [len(await latest_entries(kv, "owner.a.>")) for _ in range(1000)]

    assert results == [1] * 1000
    assert (await bus.js.stream_info(kv.stream)).state.consumer_count == 0
    assert len(bus.nc._subs) == subscriptions_before


async def test_scans_under_concurrent_writes_never_come_back_short(bus: EventBus) -> None:
    kv = await _bucket(bus)
    await asyncio.gather(*(kv.put(f"owner.a.batch.b{i:04d}", b"v0") for i in range(300)))
    stop = asyncio.Event()

    async def rewrite_forever() -> None:  # as the ledger does: one write after another, each moving a key on
        revision = 0
        while not stop.is_set():
            revision += 1
            await kv.put(f"owner.a.batch.b{revision % 300:04d}", f"v{revision}".encode())

    writer = asyncio.create_task(rewrite_forever())
    try:
        sizes = [len(await latest_entries(kv, "owner.a.batch.>")) for _ in range(30)]
    finally:
        stop.set()
        await writer
    assert sizes == [300] * 30


async def test_a_bucket_made_before_direct_reads_is_switched_to_them_for_a_service_that_scans(bus: EventBus) -> None:
    name = f"scan_old_{secrets.token_hex(4)}"
    old = await bus.js.create_key_value(bucket=name, history=1)  # as earlier versions made them
    assert not (await bus.js.stream_info(f"KV_{name}")).config.allow_direct
    await old.put("k", b"v")

    kv = await open_bucket(bus, name, scans=True)

    assert kv.direct
    assert await latest_entries(kv) == [("k", b"v")]


async def test_a_subject_of_the_event_log_is_read_whole_in_order_without_a_consumer(bus: EventBus) -> None:
    batch_id = f"batch_scan{secrets.token_hex(4)}"
    for line in range(1, SCAN_PAGE + 40):
        await bus.publish(LineRejected(aggregate_id=batch_id, line=line, code="invalid_json", message="not JSON"))
    await ensure_direct_reads(bus.js, EVENTS_STREAM)
    consumers = (await bus.js.stream_info(EVENTS_STREAM)).state.consumer_count

    messages = await read_subject(bus.js, EVENTS_STREAM, event_subject("batch", batch_id, LineRejected.name))

    assert [LineRejected.model_validate_json(m.data).line for m in messages] == list(range(1, SCAN_PAGE + 40))
    assert (await bus.js.stream_info(EVENTS_STREAM)).state.consumer_count == consumers


async def test_named_keys_are_read_by_one_direct_get_per_request_of_them_deleted_and_unknown_ones_left_out(
        bus: EventBus) -> None:
    kv = await _bucket(bus)
    count = LAST_PER_REQUEST + 44
    await asyncio.gather(*(kv.put(f"batch.b{i:04d}", f"{i}".encode()) for i in range(count)))
    await kv.put("batch.b0010", b"rewritten")
    await kv.delete("batch.b0003")
    asked = await api_requests(bus, kv.stream)

    found = await read_last(kv, [f"batch.b{i:04d}" for i in range(count + 5)])

    await bus.nc.flush()
    assert asked == {"direct": 2}
    assert len(found) == count - 1 and "batch.b0003" not in found and "batch.b9999" not in found
    assert found["batch.b0010"] == b"rewritten" and found[f"batch.b{count - 1:04d}"] == f"{count - 1}".encode()
    assert await read_last(kv, ["batch.none"]) == {} and await read_last(kv, []) == {}
