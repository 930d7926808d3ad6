"""Stopping background tasks for certain: a loop that lost its one cancel (as Python 3.11's wait_for can lose it)
is cancelled again until it ends, and one that never ends is given up on after the bound, not waited for for ever."""

import asyncio
import logging

import pytest

from services.runtime.process.tasks import cancel_and_join


async def test_a_loop_that_swallows_a_cancel_is_cancelled_again_until_it_ends() -> None:
    swallowed = 0

    async def loop() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                swallowed += 1
                if swallowed > 1:
                    raise

    task = asyncio.create_task(loop())
    await asyncio.sleep(0.01)
    assert await asyncio.wait_for(cancel_and_join([task]), 10) == set()
    assert task.cancelled() and swallowed == 2


async def test_a_task_that_never_ends_is_logged_and_left_after_the_bound(caplog: pytest.LogCaptureFixture) -> None:
    stop = asyncio.Event()

    async def stubborn() -> None:
        while not stop.is_set():
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                continue

    task = asyncio.create_task(stubborn())
    with caplog.at_level(logging.ERROR):
        left = await asyncio.wait_for(cancel_and_join([task], within_s=0.3), 5)
    assert left == {task} and not task.done() and "still running" in caplog.text
    stop.set()
    await task


async def test_a_task_gets_time_for_its_own_clean_up_before_it_is_cancelled_again() -> None:
    cleaned = asyncio.Event()

    async def tidy() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            await asyncio.sleep(1.0)  # a clean-up that awaits (closing a session, joining its own tasks)
            cleaned.set()

    task = asyncio.create_task(tidy())
    await asyncio.sleep(0.01)
    assert await cancel_and_join([task]) == set()
    assert cleaned.is_set()


async def test_ended_tasks_are_fine() -> None:
    done = asyncio.create_task(asyncio.sleep(0))
    await done
    await cancel_and_join([done])
