"""A short soak in CI (bench/soak.py is the long one): thousands of list calls, SSE streams dropped abruptly and
concurrent uploads leave no consumer, connection, thread or file descriptor behind, and the stack still takes work."""

import asyncio
import random

import aiohttp
import pytest

from tests.e2e.conftest import RunningStack
from tests.e2e.load import STORAGE_SERVERS, Load, chat_lines, sample

pytestmark = pytest.mark.e2e


async def _soak(stack: RunningStack) -> None:
    rng = random.Random(12)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64), timeout=timeout) as session:
        load = Load(stack, session)
        batch_id = await load.create_batch("soak-ci", 2)
        assert batch_id is not None, f"the first batch was refused: {load.last_refusal}"
        assert await load.until_ended(batch_id) == "completed"  # warmed up: every service made its consumers
        # ... and its pools: 16 uploads at once open up to 16 object-store connections, kept for reuse (bounded by
        # the upload slots), which are not what this test looks for.
        assert all(await asyncio.gather(*(load.upload(chat_lines(f"warm-{i}", 20)) for i in range(16))))
    # Measured with no connection of this test's open (its keep-alive pool holds up to 64 sockets in the gateway).
    await asyncio.sleep(1)
    before = await sample(stack)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64), timeout=timeout) as session:
        load = Load(stack, session)
        # 10 dashboard tabs: 2,000 list calls in all (each round lists batches and files: 2 calls, and 2 more views)
        await asyncio.gather(*(load.poll(50, rng) for _ in range(10)))
        await asyncio.gather(*(load.drop_sse(batch_id) for _ in range(200)))
        uploaded = await asyncio.gather(*(load.upload(chat_lines(f"up-{i}", 2000)) for i in range(16)))
    await asyncio.sleep(8)  # what a dropped stream held is released within moments
    after = await sample(stack)

    assert load.problems == [] and load.short_lists == 0
    assert all(file_id is not None for file_id in uploaded)
    assert load.statuses[200] >= 2000
    for stream, count in after.consumers.items():
        assert count <= before.consumers[stream], (stream, before.consumers, after.consumers)
    assert after.nats_connections <= before.nats_connections + 1
    for name, (fds, threads, _) in after.processes.items():
        fds_before, threads_before, _ = before.processes[name]
        # A connection one of our services leaks is counted at its own end; a storage server's sockets are its
        # own pools and its clients' keep-alive (which close on their idle timeouts), not a leak of ours.
        assert name in STORAGE_SERVERS or fds <= fds_before + 20, (name, fds_before, fds)
        assert threads <= threads_before + 16, (name, threads_before, threads)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        load = Load(stack, session)
        assert await load.upload(chat_lines("fresh", 3)) is not None
        status, _ = await load.call("GET", "/v1/batches")
        assert status == 200


def test_lists_streams_and_uploads_leave_nothing_behind(stack: RunningStack) -> None:
    asyncio.run(_soak(stack))
