"""An engine's one pool of slots, shared by every attempt on it: an owner alone takes every slot, a freed slot goes
to the waiting owner holding the fewest (first come first served among equals; among one owner's units, the one with
the fewest lines left to start), and neither a cancelled waiter nor an attempt told to stop ever keeps one. A unit's
planned lines go to the slot that holds their prompt prefix."""

import asyncio
import contextlib
import random

import pytest

from services.executor.held_slot import HeldSlot
from services.executor.slots import SlotPool, UnitPlan


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
    slot = await pool.take("ann", asyncio.Event())
    assert slot is not None

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


async def test_a_take_hands_a_numbered_engine_slot() -> None:
    pool = SlotPool(2)
    first = await pool.take("ann", asyncio.Event())
    assert first is not None
    second = await pool.take("ann", asyncio.Event())
    assert second is not None and {first.index, second.index} == {0, 1}
    first.give_back()
    assert pool.free == 1 and pool.held["ann"] == 1


async def start(unit: UnitPlan, owner: str = "ann") -> tuple[str | None, HeldSlot]:
    """The next line the unit starts (its prefix key) and its slot, within 0.1 s."""
    started = await asyncio.wait_for(unit.next(owner, asyncio.Event()), 0.1)
    assert started is not None
    return unit.keys[started[0]], started[1]


async def test_a_unit_never_blocks_on_one_prefix_while_another_of_its_lines_can_start_warm() -> None:
    pool = SlotPool(2)
    with pool.unit(["a", "b", "a", "b", "c"]) as unit:
        (first, a), (second, b) = await start(unit), await start(unit)
        assert (first, second) == ("a", "b")
        b.give_back()  # a's slot stays busy: b's next line, not a's, starts at once, on b's slot
        assert [(key, slot.index) for key, slot in [await start(unit)]] == [("b", b.index)]
        a.give_back()
        assert [(key, slot.index) for key, slot in [await start(unit)]] == [("a", a.index)]


async def test_a_unit_waits_for_its_busy_slot_rather_than_take_one_another_units_prefix_still_needs() -> None:
    pool = SlotPool(2)
    with pool.unit(["a", "a"]) as ones, pool.unit(["b", "b"]) as others:
        (_, a), (_, b) = await start(ones), await start(others)
        b.give_back()  # b has a line to come: its slot is kept
        waiting = asyncio.create_task(start(ones))
        await settle()
        assert not waiting.done()
        a.give_back()
        key, slot = await waiting
        assert (key, slot.index) == ("a", a.index)
        assert [(key, slot.index) for key, slot in [await start(others)]] == [("b", b.index)]


async def test_closing_a_unit_frees_the_slots_kept_for_its_prefixes() -> None:
    pool = SlotPool(2)
    others = pool.unit(["b", "b"])
    (_, b) = await start(others)
    with pool.unit(["a", "a", "a"]) as unit:  # two lanes for a
        (_, a) = await start(unit)
        b.give_back()  # kept for b's line to come
        waiting = asyncio.create_task(start(unit))
        await settle()
        assert not waiting.done()
        others.close()  # that attempt stops: b's slot is spare now, and a spreads onto it
        key, slot = await asyncio.wait_for(waiting, 0.1)
        assert (key, slot.index) == ("a", b.index)
        a.give_back()


async def test_one_prefix_alone_spreads_over_every_slot() -> None:
    pool = SlotPool(4)
    with pool.unit(["a"] * 12) as unit:
        held = [(await start(unit))[1] for _ in range(4)]
    assert sorted(slot.index for slot in held) == [0, 1, 2, 3]


async def test_an_owner_holding_fewer_is_served_first_even_against_a_line_the_freed_slot_holds_warm() -> None:
    pool = SlotPool(2)
    stop = asyncio.Event()
    with pool.unit(["a", "a", "a"]) as unit:
        (_, first), (_, second) = await start(unit, "big"), await start(unit, "big")
        warm = asyncio.create_task(unit.next("big", stop))
        await settle()
        other = asyncio.create_task(pool.take("small", stop))
        await settle()
        first.give_back()
        await settle()
        assert other.done() and not warm.done()
        second.give_back()
        assert await asyncio.wait_for(warm, 0.1) is not None


async def test_an_owner_below_its_share_takes_a_slot_another_owners_prefix_holds_rather_than_wait_for_its_own() -> None:
    pool = SlotPool(4)
    stop = asyncio.Event()
    with pool.unit(["b"] * 8) as bobs, pool.unit(["a", "a"]) as anns:
        held = [(await start(bobs, "bob"))[1] for _ in range(4)]
        bob_next = asyncio.create_task(bobs.next("bob", stop))
        ann_first = asyncio.create_task(anns.next("ann", stop))
        await settle()
        held.pop().give_back()
        assert await asyncio.wait_for(ann_first, 0.1) is not None  # ann holds none: hers before bob's warm one
        ann_second = asyncio.create_task(anns.next("ann", stop))
        await settle()
        held.pop().give_back()
        # One of four while bob holds two: she does not wait for her busy slot.
        assert await asyncio.wait_for(ann_second, 0.1) is not None and pool.held == {"ann": 2, "bob": 2}
        bob_next.cancel()
        await asyncio.gather(bob_next, return_exceptions=True)


async def test_a_unit_told_to_stop_or_cancelled_while_it_waits_keeps_its_line_and_holds_no_slot() -> None:
    pool = SlotPool(1)
    stop = asyncio.Event()
    blocker = await pool.take("other", stop)
    with pool.unit(["a", "b"]) as unit:
        waiting = asyncio.create_task(unit.next("ann", stop))
        await settle()
        stop.set()
        assert await asyncio.wait_for(waiting, 0.1) is None
        cancelled = asyncio.create_task(unit.next("ann", asyncio.Event()))
        await settle()
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        assert blocker is not None
        blocker.give_back()
        assert pool.free == 1 and not pool.held and sorted(unit.candidates(), key=str) == ["a", "b"]
        assert await unit.next("ann", stop) is None  # stopping: nothing more starts


async def test_a_unit_runs_each_line_once_and_then_says_it_is_done() -> None:
    pool = SlotPool(3)
    keys: list[str | None] = ["a", None, "b", "a", None, "c", "b"]
    started: list[int] = []
    with pool.unit(keys) as unit:
        while (next_line := await asyncio.wait_for(unit.next("ann", asyncio.Event()), 0.1)) is not None:
            line, slot = next_line
            started.append(line)
            slot.give_back()
    assert sorted(started) == list(range(len(keys)))


async def run_units(pool: SlotPool, keys: list[str | None], unit_lines: int, planned: bool,
                    at_once: int = 1) -> int:
    """Run `keys` in units, `at_once` units at a time, each line on its slot as an engine that keeps one prompt per
    slot would: a line whose prefix its slot does not hold computes it (slow). The number of lines that did."""
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

    async def unit(unit_keys: list[str | None]) -> None:
        async with asyncio.TaskGroup() as group:
            with pool.unit(unit_keys if planned else [None] * len(unit_keys)) as plan:
                while (started := await plan.next("ann", asyncio.Event())) is not None:
                    group.create_task(line(unit_keys[started[0]], started[1]))

    units = [keys[start:start + unit_lines] for start in range(0, len(keys), unit_lines)]
    for first in range(0, len(units), at_once):
        await asyncio.gather(*(unit(unit_keys) for unit_keys in units[first:first + at_once]))
    return computed


async def test_lines_of_16_interleaved_prefixes_compute_each_prefix_about_once_per_unit_not_once_per_line() -> None:
    keys: list[str | None] = [f"p{i % 16}" for i in range(128)]
    assert await run_units(SlotPool(8), keys, 64, planned=False) > 100  # in file order every slot keeps thrashing
    assert await run_units(SlotPool(8), keys, 64, planned=True) <= 16 + 8  # then 8 of the 16 are still held


async def test_units_running_at_once_share_the_slots_of_their_common_prefixes() -> None:
    keys: list[str | None] = [f"p{i % 16}" for i in range(128)]
    assert await run_units(SlotPool(8), keys, 32, planned=True, at_once=4) <= 16 + 4


async def test_an_owner_with_one_unit_gets_its_share_against_owners_with_several() -> None:
    """Lines of equal length: a slot freed by an owner goes, among owners holding as many, to the one granted a slot
    least recently. Were ties settled by the waiter that came first, the owner giving the slot back would win each
    one, and an owner with one unit's waiter against owners with four would keep a quarter of 8 slots, not a third."""
    pool, stop, done = SlotPool(8), asyncio.Event(), {"a": 0, "b": 0, "c": 0}
    share_of_c: list[float] = []

    async def unit(owner: str, lines: int) -> None:
        running = []
        with pool.unit([None] * lines) as plan:
            while (started := await plan.next(owner, stop)) is not None:
                async def line(slot: HeldSlot = started[1]) -> None:
                    await asyncio.sleep(0.01)
                    slot.give_back()
                    done[owner] += 1
                    if owner == "c" and done["c"] == lines:
                        share_of_c.append(done["c"] / sum(done.values()))
                running.append(asyncio.create_task(line()))
            await asyncio.gather(*running)

    await asyncio.wait_for(asyncio.gather(*(unit("a", 40) for _ in range(4)), *(unit("b", 40) for _ in range(4)),
                                          unit("c", 40)), 30)
    assert share_of_c and share_of_c[0] >= 0.29, f"c had {share_of_c} of the lines done when its unit ended"


async def test_while_no_slot_holds_a_prefix_a_line_starts_on_the_free_slot_used_longest_ago() -> None:
    """What `choose_start` picks then (the pool finds it without reading every slot): a slot never used first, by
    index, then the one handed out longest ago; lines with prefixes in between, the order holds again once every slot
    has been handed a line without one."""
    rng = random.Random(7)
    pool = SlotPool(6)
    handed: dict[int, int] = {}  # slot -> when it was last handed out
    prefixed: set[int] = set()  # slots whose last line had a prefix key
    held: list[HeldSlot] = []
    clock = 0
    for step in range(600):
        keyed = 200 <= step < 260 and rng.random() < 0.5
        if held and (len(held) == pool.size or rng.random() < 0.45):
            held.pop(rng.randrange(len(held))).give_back()
            continue
        free = [index for index in range(pool.size) if index not in {slot.index for slot in held}]
        expected = min(free, key=lambda index: (handed.get(index, -1), index))
        with pool.unit([f"prefix-{step}" if keyed else None]) as unit:
            key, slot = await start(unit)
        if not prefixed:
            assert slot.index == expected, step
        handed[slot.index], clock = clock, clock + 1
        (prefixed.add if key is not None else prefixed.discard)(slot.index)
        held.append(slot)


async def asking(unit: UnitPlan, owner: str, started: list[str], name: str) -> "asyncio.Task[HeldSlot]":
    """The unit's next line, asked for now and noted in `started` as `name` once it has a slot."""
    async def ask() -> HeldSlot:
        taken = await unit.next(owner, asyncio.Event())
        assert taken is not None
        started.append(name)
        return taken[1]
    task = asyncio.create_task(ask())
    await settle()
    return task


async def test_an_owners_small_batch_is_not_queued_behind_its_large_one() -> None:
    """Among one owner's batches, a freed slot goes to the one with the fewest lines left to start."""
    pool, started = SlotPool(1), list[str]()
    with pool.unit([None] * 64, "batch_large") as large, pool.unit([None], "batch_small") as small:
        _, slot = await start(large)
        large_next = await asking(large, "ann", started, "large")
        small_next = await asking(small, "ann", started, "small")  # asks after the large one
        slot.give_back()
        await settle()
        assert started == ["small"]
        (await small_next).give_back()
        await settle()
        assert started == ["small", "large"]
        (await large_next).give_back()


async def test_an_owners_batches_end_one_after_another_not_all_late_together() -> None:
    """Units of equal size: the one begun first keeps the freed slots until its lines are all started, so its batch
    ends while the next one starts, rather than each unit taking a line in turn and all of them ending in the last
    round."""
    pool, started = SlotPool(1), list[str]()
    with pool.unit([None] * 3, "batch_1") as first, pool.unit([None] * 3, "batch_2") as second:
        _, slot = await start(first)
        second_next = await asking(second, "ann", started, "second")
        first_next = await asking(first, "ann", started, "first")  # it asks again after the second unit asked
        slot.give_back()
        await settle()
        assert started == ["first"]
        first_last = await asking(first, "ann", started, "first")
        (await first_next).give_back()
        await settle()
        assert started == ["first", "first"], "its last line before the other unit's first"
        (await first_last).give_back()
        await settle()
        assert started == ["first", "first", "second"]
        (await second_next).give_back()


async def test_the_units_of_one_batch_take_turns() -> None:
    """Shards of one batch on one engine: they end together with their batch, so none is kept waiting for another."""
    pool, started = SlotPool(1), list[str]()
    with pool.unit([None] * 3, "batch_1") as first, pool.unit([None] * 3, "batch_1") as second:
        _, slot = await start(first)
        second_next = await asking(second, "ann", started, "second")
        first_next = await asking(first, "ann", started, "first")
        slot.give_back()
        await settle()
        assert started == ["second"], "the shard that asked first"
        (await second_next).give_back()
        await settle()
        assert started == ["second", "first"]
        (await first_next).give_back()


async def test_an_owners_large_batch_is_not_starved_by_its_stream_of_small_ones() -> None:
    """A batch waiting for a slot is passed over by every smaller batch of its owner that comes after it: with
    the owner's small batches arriving one after another (the scheduler sends the next as one ends), the large one
    (maybe the urgent one, near its deadline) would never start a line on this engine. It goes first once passed
    over `PASSED_OVER_LIMIT` times."""
    pool, started = SlotPool(1), list[str]()
    with pool.unit([None] * 64, "batch_large") as large:
        first_small = pool.unit([None], "batch_small_0")
        _, slot = await start(first_small)
        large_next = await asking(large, "ann", started, "large")
        smalls = [first_small]
        for n in range(1, 20):
            small = pool.unit([None], f"batch_small_{n}")
            smalls.append(small)
            small_next = await asking(small, "ann", started, f"small_{n}")
            slot.give_back()
            await settle()
            if small_next.done():
                slot = await small_next
            else:
                break
        while_smalls_came = list(started)
        slot.give_back()
        await settle()
        for small in smalls:
            small.close()
        assert "large" in while_smalls_came, while_smalls_came
        if not large_next.done():
            large_next.cancel()
        else:
            (await large_next).give_back()


async def served_in_turn(slot: HeldSlot, started: list[str], asks: dict[str, "asyncio.Task[HeldSlot]"]) -> list[str]:
    """Give `slot` back, then each slot granted as it is: the order the waiters asking (`asks`, by name) were served."""
    slot.give_back()
    served: list[str] = []
    while asks:
        await settle()
        name = started[len(served)]
        served.append(name)
        (await asks.pop(name)).give_back()
    return served


async def test_a_batch_is_weighed_by_all_its_lines_left_not_only_those_planned_now() -> None:
    """An attempt plans its lines 64 at a time: a large batch near the end of one plan is still a large batch."""
    pool, started = SlotPool(1), list[str]()
    with pool.unit([None] * 3, "batch_large", beyond=900) as large, pool.unit([None] * 10, "batch_small") as small:
        _, slot = await start(large)
        asks = {"large": await asking(large, "ann", started, "large"),  # 2 planned now, 900 to come
                "small": await asking(small, "ann", started, "small")}
        assert await served_in_turn(slot, started, asks) == ["small", "large"]


async def test_a_batchs_next_plan_keeps_its_place_among_its_owners_batches() -> None:
    """Between two batches as near their end, the one that came first goes first, whichever plan it is on now."""
    pool, started = SlotPool(1), list[str]()
    with pool.unit([None], "batch_old") as first_plan:
        _, slot = await start(first_plan)
    with pool.unit([None] * 4, "batch_new") as new, pool.unit([None] * 4, "batch_old") as second_plan:
        asks = {"new": await asking(new, "ann", started, "new"),
                "old": await asking(second_plan, "ann", started, "old")}
        assert await served_in_turn(slot, started, asks) == ["old", "new"]
