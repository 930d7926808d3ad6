"""The gateway's background loops: a step run every so often (a failed one logged and run again, a cancel never
swallowed, an interval of 0 never running it), and their tasks ended with the block that began them, however it
ends."""

import asyncio
import logging

import pytest

from services.gateway.background.loops import every, running


async def test_an_interval_of_zero_never_runs_the_step() -> None:
    ran: list[int] = []

    async def step() -> None:
        ran.append(1)

    await asyncio.wait_for(every(0, step, "never", at_once=True), 1.0)
    assert ran == []


async def test_a_failed_step_is_logged_and_run_again(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []
    again = asyncio.Event()

    async def step() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the first turn fails")
        again.set()

    async with running(every(0.01, step, "the test step", at_once=True)):
        await asyncio.wait_for(again.wait(), 5.0)
    assert "the test step failed" in caplog.text
    assert any(record.levelno == logging.ERROR and record.exc_info for record in caplog.records)


async def test_without_at_once_the_first_step_waits_one_interval() -> None:
    ran = asyncio.Event()

    async def step() -> None:
        ran.set()

    async with running(every(60, step, "hourly")):
        await asyncio.sleep(0.05)
    assert not ran.is_set()


async def test_without_at_once_the_step_runs_once_an_interval_has_passed() -> None:
    ran = asyncio.Event()
    loop = asyncio.get_running_loop()

    async def step() -> None:
        ran.set()

    started = loop.time()
    async with running(every(0.05, step, "soon")):
        await asyncio.wait_for(ran.wait(), 5.0)
    assert loop.time() - started >= 0.05


async def test_a_loop_that_dies_of_an_error_is_logged_as_it_dies(caplog: pytest.LogCaptureFixture) -> None:
    died = asyncio.Event()

    async def watch() -> None:
        died.set()
        raise ConnectionError("the watch's broker went away")

    async with running(watch()):
        await asyncio.wait_for(died.wait(), 5.0)
        for _ in range(10):
            await asyncio.sleep(0)  # the task's done callback runs on a later turn
        assert "background loop" in caplog.text and "the watch's broker went away" in caplog.text


async def test_a_cancel_during_a_step_ends_the_loop() -> None:
    entered = asyncio.Event()

    async def hangs() -> None:
        entered.set()
        await asyncio.Event().wait()

    loop = asyncio.create_task(every(0.01, hangs, "hangs", at_once=True))
    await asyncio.wait_for(entered.wait(), 5.0)
    loop.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(loop, 5.0)


async def test_running_ends_its_tasks_when_the_block_ends_or_fails() -> None:
    started, ended = asyncio.Event(), asyncio.Event()

    async def forever() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            ended.set()

    with pytest.raises(RuntimeError):
        async with running(forever()):
            await asyncio.wait_for(started.wait(), 5.0)
            raise RuntimeError("the block fails")
    assert ended.is_set()
