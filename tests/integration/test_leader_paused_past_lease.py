"""A leader paused past its lease's TTL (GC, SIGSTOP, a frozen VM) resumes believing it leads: `Term.lead` judges
leadership by `keeper.done()` alone, and the keeper notices the loss only a renewal later (a third of the TTL, then a
round trip), while the term's next tick acts on its stale book beside the standby that took over."""

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator

from services.runtime.nats.bus import EventBus
from services.runtime.nats.leader import LeaderLease
from tests.conftest import RunningNats

TTL_S = 1.0


@contextlib.asynccontextmanager
async def leading(nats_server: RunningNats,
                  role: str) -> AsyncIterator[tuple[LeaderLease, asyncio.Task[None], asyncio.Event]]:
    """A leader holding `role`'s lease and keeping it (until the block ends or its stop is set)."""
    bus = await EventBus.connect(nats_server.url, f"tests-leader-{role}")
    stop = asyncio.Event()
    try:
        lease = await LeaderLease.open(bus, TTL_S, role)
        assert await lease.acquire(stop)
        keeper = asyncio.create_task(lease.keep(stop))
        yield lease, keeper, stop
    finally:
        stop.set()
        await bus.close()


def standby_takes_over(url: str, took: threading.Event) -> None:
    """Another scheduler process: waits for the lease and takes it (on its own loop and connection)."""
    async def run() -> None:
        bus = await EventBus.connect(url, "tests-leader-b")
        try:
            second = await LeaderLease.open(bus, TTL_S, "paused-role")
            second.holder += "-b"
            if await asyncio.wait_for(second.acquire(asyncio.Event()), 10):
                took.set()
        finally:
            await bus.close()
    asyncio.run(run())


async def test_a_leader_resuming_after_a_standby_took_its_lease_does_not_count_as_leading(
        fresh_nats: RunningNats) -> None:
    async with leading(fresh_nats, "paused-role") as (first, keeper, stop):
        await asyncio.sleep(0.1)
        took = threading.Event()
        standby = threading.Thread(target=standby_takes_over, args=(fresh_nats.url, took))
        standby.start()
        # The leader's process is paused: nothing of it runs while its entry expires and the standby takes it.
        assert took.wait(10), "the standby takes over"
        standby.join()
        # It resumes: as `Term.lead` judges it before its next tick, does it still lead? It must not.
        still_leading = not keeper.done() and not first.lost()
        stop.set()
        await keeper
        assert not still_leading, "the resumed leader counts as leading though a standby holds its lease"


async def test_a_leader_keeps_its_lease_through_a_write_no_holder_made_and_yields_to_a_holders(
        fresh_nats: RunningNats) -> None:
    """An executor's request may name the lease key as its reply subject, and the broker itself then writes its answer
    there (a JetStream reply, an ack): the leader renews over such a write, but not over another holder's."""
    async with leading(fresh_nats, "junk-role") as (lease, keeper, _):
        for junk in (b"", b'{"stream":"KV_sheshnag_executors","seq":7}'):
            await lease.kv.put("junk-role", junk)
            await asyncio.sleep(TTL_S)  # three renewals' time
            assert not keeper.done(), "the leader lost its lease to a write no holder made"
            assert (await lease.kv.get("junk-role")).value == lease.holder.encode()
        await lease.kv.put("junk-role", b"other-host:1f")  # a standby that took over
        await asyncio.wait_for(keeper, 5)
