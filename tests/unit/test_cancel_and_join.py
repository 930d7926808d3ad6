"""Stopping background tasks for certain: a loop that lost its one cancel (as Python 3.11's wait_for can lose it)
is cancelled again until it ends, and one that never ends is given up on after the bound, not waited for for ever."""

import asyncio
import logging

import pytest

from services.runtime.tasks import cancel_and_join


async def test_a_loop_that_swallows_a_cancel_is_cancelled_again_until_it_ends() -> None:
    swallowed = 0

    async def loop() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                swallowed += 1
                if swallowed > 2:
                    raise

    task = asyncio.create_task(loop())
    await asyncio.sleep(0.01)
    await asyncio.wait_for(cancel_and_join([task]), 5)
    assert task.cancelled() and swallowed == 3


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
        await asyncio.wait_for(cancel_and_join([task], within_s=0.3), 5)
    assert not task.done() and "still running" in caplog.text
    stop.set()
    await task


async def test_ended_tasks_are_fine() -> None:
    done = asyncio.create_task(asyncio.sleep(0))
    await done
    await cancel_and_join([done])
