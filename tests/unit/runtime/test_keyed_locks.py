"""Locks by key: one task at a time per key, keys apart at once, and no lock kept once nobody holds or awaits it
(also after a waiter is cancelled)."""

import asyncio

from services.runtime.process.keyed_locks import KeyedLocks


async def test_tasks_of_one_key_run_one_at_a_time_and_other_keys_at_once() -> None:
    locks = KeyedLocks()
    inside: dict[str, int] = {"a": 0, "b": 0}
    most: dict[str, int] = {"a": 0, "b": 0}
    both = asyncio.Event()

    async def hold(key: str) -> None:
        async with locks.hold(key):
            inside[key] += 1
            most[key] = max(most[key], inside[key])
            if inside["a"] and inside["b"]:
                both.set()
            await asyncio.sleep(0.01)
            inside[key] -= 1

    await asyncio.gather(*(hold(key) for key in "abababab"))

    assert most == {"a": 1, "b": 1}
    assert both.is_set()
    assert len(locks) == 0


async def test_after_a_thousand_owners_no_lock_is_kept() -> None:
    locks = KeyedLocks()

    async def hold(key: str) -> None:
        async with locks.hold(key):
            assert len(locks) >= 1
            await asyncio.sleep(0)

    await asyncio.gather(*(hold(f"owner-{n % 1000}") for n in range(3000)))

    assert len(locks) == 0


async def test_a_waiter_cancelled_before_its_turn_leaves_nothing_behind() -> None:
    locks = KeyedLocks()
    release = asyncio.Event()

    async def holder() -> None:
        async with locks.hold("a"):
            await release.wait()

    async def waiter() -> None:
        async with locks.hold("a"):
            raise AssertionError("never its turn")

    first = asyncio.create_task(holder())
    await asyncio.sleep(0)
    second = asyncio.create_task(waiter())
    await asyncio.sleep(0)
    second.cancel()
    await asyncio.gather(second, return_exceptions=True)
    release.set()
    await first

    assert len(locks) == 0
