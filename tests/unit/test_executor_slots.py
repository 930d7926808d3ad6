"""An engine's one pool of slots, shared by every attempt on it: an owner alone takes every slot, a freed slot goes
to the waiting owner holding the fewest (first come first served among equals), and neither a cancelled waiter nor
an attempt told to stop ever keeps one."""

import asyncio
import contextlib

import pytest

from services.executor.slots import SlotPool


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
    assert await asyncio.wait_for(taking, 0.1) is False
    assert await pool.take("bob", stopping) is False
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
    assert await taking is False
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
