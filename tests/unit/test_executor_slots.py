"""An engine's one pool of slots, shared by every attempt on it: an owner alone takes every slot, a freed slot goes
to the waiting owner holding the fewest (first come first served among equals), and neither a cancelled waiter nor
an attempt told to stop ever keeps one. A unit's planned lines go to the slot that holds their prompt prefix."""

import asyncio
import contextlib
import random

import pytest

from services.executor.slots import HeldSlot, SlotPool


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def waiter(pool: SlotPool, owner: str, granted: list[str]) -> "asyncio.Task[None]":
    async def acquire() -> None:
        await pool.acquire(owner)
        granted.append(owner)
    return asyncio.create_task(acquire())


async def test_an_owner_alone_takes_every_slot_at_once_and_waits_for_one_beyond() -> None:
    pool = SlotPool(3)
    for _ in range(3):
        await asyncio.wait_for(pool.acquire("alice"), 0.1)
    assert pool.free == 0 and pool.held["alice"] == 3
    granted: list[str] = []
    fourth = waiter(pool, "alice", granted)
    await settle()
    assert granted == [] and pool.waiting == 1
    pool.release("alice")
    await fourth
    assert granted == ["alice"] and pool.held["alice"] == 3


async def test_a_freed_slot_goes_to_the_waiting_owner_holding_the_fewest() -> None:
    pool = SlotPool(2)
    await pool.acquire("big")
    await pool.acquire("big")
    granted: list[str] = []
    tasks = [waiter(pool, "big", granted) for _ in range(3)]
    await settle()
    tasks.append(waiter(pool, "small", granted))  # asks last, holds none: served first
    await settle()
    pool.release("big")
    await settle()
    assert granted == ["small"]
    pool.release("big")
    await settle()
    assert granted == ["small", "big"] and dict(pool.held) == {"big": 1, "small": 1}
    for _ in range(2):
        pool.release("big")
        await settle()
    assert granted == ["small", "big", "big", "big"]
    await asyncio.gather(*tasks)


async def test_shares_even_out_between_owners_while_both_wait() -> None:
    pool = SlotPool(4)
    for _ in range(4):
        await pool.acquire("alice")
    granted: list[str] = []
    tasks = [waiter(pool, "alice", granted) for _ in range(4)] + [waiter(pool, "bob", granted) for _ in range(4)]
    await settle()
    for _ in range(4):  # alice's lines finish one by one
        pool.release("alice")
        await settle()
    assert dict(pool.held) == {"alice": 2, "bob": 2}
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_owners_holding_as_many_are_served_first_come_first_served() -> None:
    pool = SlotPool(1)
    await pool.acquire("holder")
    granted: list[str] = []
    tasks = []
    for owner in ("carol", "dave", "erin"):
        tasks.append(waiter(pool, owner, granted))
        await settle()
    for owner in ("holder", "carol", "dave"):
        pool.release(owner)
        await settle()
    assert granted == ["carol", "dave", "erin"]
    await asyncio.gather(*tasks)


async def test_a_cancelled_waiter_holds_no_slot_and_the_next_one_gets_it() -> None:
    pool = SlotPool(1)
    await pool.acquire("alice")
    granted: list[str] = []
    cancelled, patient = waiter(pool, "bob", granted), waiter(pool, "carol", granted)
    await settle()
    cancelled.cancel()
    await settle()
    pool.release("alice")
    await patient
    assert granted == ["carol"] and dict(pool.held) == {"carol": 1} and pool.waiting == 0
    assert cancelled.cancelled()


async def test_a_waiter_cancelled_as_its_slot_is_granted_gives_it_back() -> None:
    pool = SlotPool(1)
    await pool.acquire("alice")
    granted: list[str] = []
    raced, next_one = waiter(pool, "bob", granted), waiter(pool, "carol", granted)
    await settle()
    pool.release("alice")  # bob is granted the slot, but is cancelled before it resumes
    raced.cancel()
    await next_one
    assert granted == ["carol"] and dict(pool.held) == {"carol": 1}


async def test_a_cancelled_waiter_does_not_hold_up_one_that_asks_after_it_while_a_slot_is_free() -> None:
    pool = SlotPool(1)
    await pool.acquire("alice")
    granted: list[str] = []
    cancelled = waiter(pool, "bob", granted)
    await settle()
    cancelled.cancel()  # still listed until it resumes
    pool.release("alice")
    await asyncio.wait_for(pool.acquire("carol"), 0.1)
    assert dict(pool.held) == {"carol": 1}
    await asyncio.gather(cancelled, return_exceptions=True)
    assert pool.waiting == 0


async def test_an_attempt_that_must_stop_takes_no_slot_and_stops_waiting_for_one() -> None:
    pool = SlotPool(1)
    stopping = asyncio.Event()
    assert await pool.take("alice", stopping)
    taking = asyncio.create_task(pool.take("bob", stopping))
    await settle()
    stopping.set()
    assert await asyncio.wait_for(taking, 0.1) is None
    assert await pool.take("bob", stopping) is None
    pool.release("alice")
    assert pool.free == 1 and pool.waiting == 0 and not pool.held


async def test_a_stop_that_lands_with_the_grant_gives_the_slot_back() -> None:
    pool = SlotPool(1)
    await pool.acquire("alice")
    stopping = asyncio.Event()
    taking = asyncio.create_task(pool.take("bob", stopping))
    await settle()
    pool.release("alice")
    stopping.set()
    assert await taking is None
    assert pool.free == 1 and not pool.held


async def test_a_take_cancelled_while_it_waits_leaks_nothing() -> None:
    pool = SlotPool(1)
    await pool.acquire("alice")
    taking = asyncio.create_task(pool.take("bob", asyncio.Event()))
    await settle()
    taking.cancel()
    with pytest.raises(asyncio.CancelledError):
        await taking
    await settle()
    pool.release("alice")
    assert pool.free == 1 and pool.waiting == 0 and not pool.held


def test_releasing_a_slot_not_held_is_a_bug() -> None:
    with pytest.raises(RuntimeError):
        SlotPool(1).release("nobody")


async def test_a_slot_held_for_a_task_cancelled_before_it_ran_goes_back_once() -> None:
    """A task group cancels the tasks a failing sibling leaves unstarted: their coroutines' `finally` never runs."""
    pool = SlotPool(1)
    await pool.acquire("ann")
    slot = pool.held_by("ann")

    async def line() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            slot.give_back()

    task = asyncio.get_running_loop().create_task(line())
    task.add_done_callback(slot.give_back)
    task.cancel()  # before its first step
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert pool.free == 1 and pool.held == {}
    slot.give_back()  # once only: a second give-back releases nothing more
    assert pool.free == 1


async def test_a_take_hands_a_numbered_engine_slot_and_held_by_names_the_same_one() -> None:
    pool = SlotPool(2)
    first = await pool.take("ann", asyncio.Event())
    assert first is not None and pool.held_by("ann") is first
    second = await pool.take("ann", asyncio.Event())
    assert second is not None and {first.index, second.index} == {0, 1}
    first.give_back()
    assert pool.free == 1 and pool.held["ann"] == 1


async def test_a_planned_line_waits_for_the_busy_slot_holding_its_prefix_not_one_another_prefix_needs() -> None:
    pool = SlotPool(2)
    stop = asyncio.Event()
    with pool.unit(["a", "b", "a", "b"]) as unit:
        assert [unit.keys[i] for i in unit.order] == ["a", "b", "a", "b"]
        a = await unit.take("ann", unit.order[0], stop)
        b = await unit.take("ann", unit.order[1], stop)
        assert a is not None and b is not None
        b.give_back()  # b's slot is free, but b has a line to come: a's next line waits for a's slot
        taking = asyncio.create_task(unit.take("ann", unit.order[2], stop))
        await settle()
        assert not taking.done()
        a.give_back()
        again = await asyncio.wait_for(taking, 0.1)
        assert again is not None and again.index == a.index
        last = await unit.take("ann", unit.order[3], stop)
        assert last is not None and last.index == b.index


async def test_closing_a_unit_frees_the_slots_kept_for_its_prefixes() -> None:
    pool = SlotPool(2)
    stop = asyncio.Event()
    with pool.unit(["a", "b", "a", "b"]) as unit:
        a, b = [await unit.take("ann", i, stop) for i in unit.order[:2]]
        assert a is not None and b is not None
        b.give_back()
        taking = asyncio.create_task(unit.take("ann", unit.order[2], stop))
        await settle()
        assert not taking.done()
    granted = await asyncio.wait_for(taking, 0.1)  # the attempt stops planning: the line takes b's slot
    assert granted is not None and granted.index == b.index


async def test_one_prefix_alone_spreads_over_every_slot() -> None:
    pool = SlotPool(4)
    stop = asyncio.Event()
    with pool.unit(["a"] * 12) as unit:
        held = [await asyncio.wait_for(unit.take("ann", i, stop), 0.1) for i in unit.order[:4]]
    assert sorted(slot.index for slot in held if slot is not None) == [0, 1, 2, 3]


async def test_an_owner_holding_fewer_is_served_first_even_against_a_line_the_freed_slot_holds_warm() -> None:
    pool = SlotPool(2)
    stop = asyncio.Event()
    with pool.unit(["a", "a", "a"]) as unit:
        first, second = [await unit.take("big", i, stop) for i in unit.order[:2]]
        warm = asyncio.create_task(unit.take("big", unit.order[2], stop))
        await settle()
        other = asyncio.create_task(pool.take("small", stop))
        await settle()
        assert first is not None and second is not None
        first.give_back()
        await settle()
        assert other.done() and not warm.done()
        second.give_back()
        assert await asyncio.wait_for(warm, 0.1) is not None


async def run_units(pool: SlotPool, keys: list[str | None], unit_lines: int, planned: bool) -> int:
    """Run `keys` in units, each line on its slot as an engine that keeps one prompt per slot would: a line whose
    prefix its slot does not hold computes it (slow). The number of lines that computed their prefix."""
    cache: dict[int, str | None] = {}
    computed = 0
    rng = random.Random(7)

    async def line(key: str | None, slot: HeldSlot) -> None:
        nonlocal computed
        hit = key is not None and cache.get(slot.index) == key
        computed += not hit
        await asyncio.sleep((0.001 if hit else 0.01) * (1 + rng.random()))
        cache[slot.index] = key
        slot.give_back()

    stop = asyncio.Event()
    for start in range(0, len(keys), unit_lines):
        unit_keys = keys[start:start + unit_lines]
        async with asyncio.TaskGroup() as group:
            with pool.unit(unit_keys if planned else [None] * len(unit_keys)) as unit:
                for index in unit.order:
                    slot = await unit.take("ann", index, stop)
                    assert slot is not None
                    group.create_task(line(unit_keys[index], slot))
    return computed


async def test_lines_of_16_interleaved_prefixes_compute_each_prefix_about_once_per_unit_not_once_per_line() -> None:
    keys: list[str | None] = [f"p{i % 16}" for i in range(128)]
    assert await run_units(SlotPool(8), keys, 64, planned=False) > 100  # in file order every slot keeps thrashing
    computed = await run_units(SlotPool(8), keys, 64, planned=True)
    assert computed <= 16 + 8  # the first unit computes 16; the next starts on the 8 still held
