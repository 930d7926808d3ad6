"""Reads shared by the requests in flight: the callers of one key that ask together get one read's answer, a caller
is only answered by a read that began after it asked, and nothing stays behind once the callers have their answers."""

import asyncio

import pytest

from services.gateway.adapters.shared_reads import SharedReads


class GatedIndex:
    """An owner's index whose reads wait at a gate the test opens; each read answers a fresh copy of the index."""

    def __init__(self) -> None:
        self.records = ["file-1"]
        self.reads = 0
        self.gate = asyncio.Event()

    async def read(self) -> list[str]:
        self.reads += 1
        seen = list(self.records)  # what the scan saw as it began
        await self.gate.wait()
        return seen


async def until(condition: object) -> None:
    for _ in range(1000):
        if callable(condition) and condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


async def test_callers_that_arrive_while_a_read_runs_share_the_next_read_and_see_what_came_before_them() -> None:
    shared, index = SharedReads(), GatedIndex()
    first = asyncio.create_task(shared.read("owner", index.read))
    await until(lambda: index.reads == 1)
    index.records.append("file-2")  # acknowledged after the running read began, before the next callers asked
    later = [asyncio.create_task(shared.read("owner", index.read)) for _ in range(20)]
    await until(lambda: all(not task.done() for task in later) and shared.in_flight() == 2)

    index.gate.set()
    answers = await asyncio.gather(first, *later)

    assert answers[0] == ["file-1"]
    assert all(answer == ["file-1", "file-2"] for answer in answers[1:])
    assert index.reads == 2  # 21 callers, one read each side of the one that was running
    assert shared.in_flight() == 0 and not shared.waiting and not shared.latest and not shared.unfinished


async def test_callers_of_different_keys_do_not_share_a_read() -> None:
    shared, index = SharedReads(), GatedIndex()
    index.gate.set()

    await asyncio.gather(*(shared.read(owner, index.read) for owner in ("a", "b", "c")))

    assert index.reads == 3
    assert shared.in_flight() == 0


async def test_a_failed_read_fails_each_of_its_callers_and_the_next_caller_reads_afresh() -> None:
    shared = SharedReads()
    failing = asyncio.Event()

    async def broken() -> list[str]:
        await failing.wait()
        raise ConnectionError("the broker went away")

    callers = [asyncio.create_task(shared.read("owner", broken)) for _ in range(3)]
    await until(lambda: shared.in_flight() == 1)
    failing.set()
    outcomes = await asyncio.gather(*callers, return_exceptions=True)

    assert all(isinstance(outcome, ConnectionError) for outcome in outcomes)

    async def fine() -> list[str]:
        return ["file-1"]

    assert await shared.read("owner", fine) == ["file-1"]
    assert shared.in_flight() == 0


async def test_a_caller_that_goes_away_leaves_the_read_to_the_others_and_nothing_behind() -> None:
    shared, index = SharedReads(), GatedIndex()
    leaving = asyncio.create_task(shared.read("owner", index.read))
    staying = asyncio.create_task(shared.read("owner", index.read))
    await until(lambda: index.reads == 1)

    leaving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    index.gate.set()

    assert await staying == ["file-1"]
    assert index.reads == 1
    await until(lambda: shared.in_flight() == 0)
