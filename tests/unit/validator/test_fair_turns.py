"""Owners take turns at the validator: one validation per owner at a time, `at_once` in all, the next turn going to
the owner who has waited longest since their last; each owner's batches in the order they came. A waiter that gives
up leaves no trace, and a turn ended by an error passes on."""

import asyncio

import pytest

from services.validator.fair_turns import FairTurns


async def started_in_order(turns: FairTurns, arrivals: list[tuple[str, str]]) -> list[str]:
    """Each (owner, batch) asks for a turn in this order while the first holds its turn; the batches in the order
    their turns came."""
    started: list[str] = []
    all_asked = asyncio.Event()

    async def validate(owner: str, batch: str) -> None:
        async with turns.turn(owner):
            started.append(batch)
            await all_asked.wait()

    tasks = []
    for owner, batch in arrivals:
        tasks.append(asyncio.create_task(validate(owner, batch)))
        await asyncio.sleep(0)
    all_asked.set()
    await asyncio.gather(*tasks)
    return started


async def test_another_owners_batch_goes_next_not_after_every_one_queued_before_it() -> None:
    arrivals = [("alice", f"a{n}") for n in range(5)] + [("bob", "b0")]
    assert await started_in_order(FairTurns(1), arrivals) == ["a0", "b0", "a1", "a2", "a3", "a4"]


async def test_owners_take_turns_and_each_owners_batches_keep_their_order() -> None:
    arrivals = [("alice", "a0"), ("alice", "a1"), ("bob", "b0"), ("bob", "b1"), ("carol", "c0"), ("alice", "a2")]
    assert await started_in_order(FairTurns(1), arrivals) == ["a0", "b0", "c0", "a1", "b1", "a2"]


async def test_a_second_place_goes_to_another_owner_never_to_the_owner_already_running() -> None:
    turns = FairTurns(2)
    alice_first = asyncio.Event()
    held = asyncio.Event()

    async def hold(owner: str, entered: asyncio.Event) -> None:
        async with turns.turn(owner):
            entered.set()
            await held.wait()

    first = asyncio.create_task(hold("alice", alice_first))
    await alice_first.wait()
    alice_second, bob = asyncio.Event(), asyncio.Event()
    second = asyncio.create_task(hold("alice", alice_second))
    third = asyncio.create_task(hold("bob", bob))
    await bob.wait()
    assert not alice_second.is_set() and turns.running == {"alice", "bob"}
    held.set()
    await asyncio.gather(first, second, third)
    assert turns.running == set() and turns.waiting() == 0


async def test_a_waiter_cancelled_leaves_no_trace_and_a_turn_ended_by_an_error_passes_on() -> None:
    turns = FairTurns(1)
    release = asyncio.Event()

    async def hold() -> None:
        async with turns.turn("alice"):
            await release.wait()
            raise RuntimeError("the check failed")

    holder = asyncio.create_task(hold())
    await asyncio.sleep(0)
    gone = asyncio.create_task(turns.turn("bob").__aenter__())
    await asyncio.sleep(0)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert turns.waiting() == 0
    release.set()
    with pytest.raises(RuntimeError):
        await holder
    async with turns.turn("carol"):
        assert turns.running == {"carol"}


async def test_a_turn_ending_after_the_next_waiter_was_cancelled_passes_to_the_one_after() -> None:
    """A stop cancels every task at once: the holder's turn may end before a cancelled waiter has run to withdraw.
    The turn skips that waiter (its future is cancelled, not given a result) and goes on to the next."""
    turns = FairTurns(1)
    release = asyncio.Event()

    async def hold(owner: str) -> None:
        async with turns.turn(owner):
            await release.wait()

    holder = asyncio.create_task(hold("alice"))
    await asyncio.sleep(0)
    cancelled = asyncio.create_task(hold("bob"))
    await asyncio.sleep(0)
    after = asyncio.create_task(hold("carol"))
    await asyncio.sleep(0)
    holder.cancel()
    cancelled.cancel()  # after the holder: its turn ends first
    results = await asyncio.gather(holder, cancelled, return_exceptions=True)
    assert all(isinstance(result, asyncio.CancelledError) for result in results), results
    assert turns.running == {"carol"}
    release.set()
    await after
    assert turns.running == set() and turns.waiting() == 0
