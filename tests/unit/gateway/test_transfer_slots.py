"""Fair transfer slots: an owner holds at most its share, waiting owners are served in turn, a wait that ends (in
time, cancelled, or just as its slot came) gives everything back, and an address has only so many uploads in
flight; the body pace cuts a client that trickles, never one whose bytes wait on the object store."""

import asyncio

import pytest

from services.gateway.http.body_pace import BodyPace
from services.gateway.http.transfer_slots import AtOnce, FairSlots, too_many_uploads
from services.gateway.usecases.refusals import ApiError


async def hold_until(slots: FairSlots, owner: str, release: asyncio.Event, order: list[str]) -> None:
    async with slots.slot(owner):
        order.append(owner)
        await release.wait()


async def test_an_owner_holds_at_most_its_share_and_another_owner_takes_a_slot_at_once() -> None:
    slots = FairSlots(slots=4, per_owner=2, wait_s=5)
    release, order = asyncio.Event(), list[str]()
    greedy = [asyncio.create_task(hold_until(slots, "greedy", release, order)) for _ in range(10)]
    await asyncio.sleep(0.01)

    async with slots.slot("other"):
        assert slots.held == {"greedy": 2, "other": 1}

    assert slots.waiting() == 8
    release.set()
    await asyncio.gather(*greedy)
    assert (slots.in_use, slots.held, slots.waiting()) == (0, {}, 0)


async def test_freed_slots_go_to_waiting_owners_in_turn_not_in_arrival_order() -> None:
    slots = FairSlots(slots=1, per_owner=1, wait_s=5)
    gates = {name: asyncio.Event() for name in ("first", "a", "b", "c")}
    order: list[str] = []
    first = asyncio.create_task(hold_until(slots, "first", gates["first"], order))
    await asyncio.sleep(0)
    waiters = [asyncio.create_task(hold_until(slots, owner, gates[owner], order))
               for owner in ("a", "a", "a", "b", "c")]
    await asyncio.sleep(0)

    for event in gates.values():
        event.set()
    await asyncio.gather(first, *waiters)

    assert order == ["first", "a", "b", "c", "a", "a"]


async def test_a_wait_past_its_limit_is_503_server_busy_and_leaves_the_line() -> None:
    slots = FairSlots(slots=1, per_owner=1, wait_s=0.05)
    release = asyncio.Event()
    holder = asyncio.create_task(hold_until(slots, "a", release, []))
    await asyncio.sleep(0)

    with pytest.raises(ApiError) as refused:
        async with slots.slot("b"):
            pass

    assert (refused.value.status, refused.value.body.code, refused.value.retry_after_s) == (503, "server_busy", 5)
    assert slots.waiting() == 0
    release.set()
    await holder
    assert (slots.in_use, slots.held) == (0, {})


async def test_a_cancelled_wait_gives_back_the_slot_that_came_as_it_was_cancelled() -> None:
    slots = FairSlots(slots=1, per_owner=1, wait_s=5)
    release = asyncio.Event()
    holder = asyncio.create_task(hold_until(slots, "a", release, []))
    await asyncio.sleep(0)
    waiting = asyncio.create_task(hold_until(slots, "b", asyncio.Event(), []))
    cancelled_early = asyncio.create_task(hold_until(slots, "c", asyncio.Event(), []))
    await asyncio.sleep(0)
    cancelled_early.cancel()  # cancelled while waiting: the line forgets it

    release.set()
    await asyncio.sleep(0)  # the holder leaves: the slot goes to b, whose task has not run yet
    waiting.cancel()
    await asyncio.gather(holder, waiting, cancelled_early, return_exceptions=True)

    assert (slots.in_use, slots.held, slots.waiting()) == (0, {}, 0)
    async with slots.slot("d"):
        assert slots.held == {"d": 1}


async def test_an_address_past_its_uploads_in_flight_gets_429_and_its_count_comes_back() -> None:
    in_flight = AtOnce(2, too_many_uploads)
    with in_flight.holding("10.0.0.1"), in_flight.holding("10.0.0.1"):
        with pytest.raises(ApiError) as refused, in_flight.holding("10.0.0.1"):
            pass
        with in_flight.holding("10.0.0.2"):
            pass
    assert (refused.value.status, refused.value.body.code) == (429, "too_many_uploads")
    assert in_flight.counts == {}


class Body:
    """A request body arriving `chunk` bytes every `every_s`; reads return what has arrived."""

    def __init__(self, chunk: int, every_s: float) -> None:
        self.total = 0
        self.chunk, self.every_s = chunk, every_s

    async def read(self) -> int:
        await asyncio.sleep(self.every_s)
        self.total += self.chunk
        return self.chunk


async def test_a_trickling_body_is_cut_with_408_after_one_window_of_waiting() -> None:
    body = Body(chunk=1, every_s=0.01)
    pace = BodyPace(lambda: body.total, idle_s=30, min_bytes_per_s=1000, window_s=0.2)

    with pytest.raises(ApiError) as cut:
        for _ in range(1000):
            await pace.read(body.read())

    assert (cut.value.status, cut.value.body.code) == (408, "request_timeout")
    assert "slower than the minimum" in cut.value.body.message
    assert 1 <= body.total <= 25, "cut within the first window (at most its ~20 bytes; fewer on a loaded machine)"


async def test_a_body_fast_enough_is_never_cut_and_time_on_the_store_is_not_the_clients() -> None:
    # 2,000 bytes after each 10 ms of waiting: far above the minimum, however a loaded machine stretches the wait;
    # with the store's 0.3 s counted too it would be 6.5 kB/s, below it.
    body = Body(chunk=2000, every_s=0.01)
    pace = BodyPace(lambda: body.total, idle_s=30, min_bytes_per_s=10_000, window_s=0.5)

    for _ in range(8):
        await pace.read(body.read())
        await asyncio.sleep(0.3)  # the object store takes its time; the client's bytes wait in the buffer

    assert body.total == 16_000


async def test_a_body_that_stops_is_cut_at_the_window_or_at_the_idle_timeout() -> None:
    never = asyncio.Event()
    pace = BodyPace(lambda: 0, idle_s=0.05, min_bytes_per_s=0, window_s=10)
    with pytest.raises(ApiError) as idle:
        await pace.read(never.wait())
    assert "sent no bytes" in idle.value.body.message

    pace = BodyPace(lambda: 0, idle_s=30, min_bytes_per_s=100, window_s=0.05)
    with pytest.raises(ApiError) as slow:
        await pace.read(never.wait())
    assert slow.value.status == 408 and "slower than the minimum" in slow.value.body.message
