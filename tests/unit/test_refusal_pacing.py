"""Refusal pacing: an address past its budget of refusals gets its next refusals late; successes, other errors and
other addresses are never delayed, and the budget comes back once the window has passed."""

import asyncio
import time

from aiohttp import web

from services.gateway.refusal_pacing import MAX_WAITING, RefusalPacer


async def answered_in(pacer: RefusalPacer, address: str, status: int) -> float:
    started = time.monotonic()
    await pacer.pace(address, web.Response(status=status))
    return time.monotonic() - started


async def test_refusals_past_the_budget_are_answered_late_and_nothing_else_is() -> None:
    pacer = RefusalPacer(budget=5, window_s=60, delay_s=0.2)

    fast = [await answered_in(pacer, "10.0.0.1", 401) for _ in range(5)]
    late = await answered_in(pacer, "10.0.0.1", 403)

    assert max(fast) < 0.1 and late >= 0.2
    assert await answered_in(pacer, "10.0.0.1", 200) < 0.1
    assert await answered_in(pacer, "10.0.0.1", 400) < 0.1
    assert await answered_in(pacer, "10.0.0.2", 429) < 0.1


async def test_the_budget_returns_once_the_window_has_passed() -> None:
    pacer = RefusalPacer(budget=2, window_s=0.3, delay_s=0.2)
    for _ in range(3):
        await answered_in(pacer, "10.0.0.1", 401)

    await asyncio.sleep(0.35)

    assert await answered_in(pacer, "10.0.0.1", 401) < 0.1


async def test_past_the_waiting_cap_a_refusal_goes_at_once_and_closes_its_connection() -> None:
    pacer = RefusalPacer(budget=1, window_s=60, delay_s=5)
    await answered_in(pacer, "10.0.0.1", 401)
    waiting = [asyncio.create_task(pacer.pace("10.0.0.1", web.Response(status=401))) for _ in range(MAX_WAITING)]
    await asyncio.sleep(0.05)

    response = web.Response(status=401)
    started = time.monotonic()
    await pacer.pace("10.0.0.1", response)

    assert time.monotonic() - started < 0.1 and response.keep_alive is False
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
    assert pacer.waiting == {}


async def test_a_budget_of_zero_turns_pacing_off() -> None:
    pacer = RefusalPacer(budget=0, window_s=60, delay_s=5)
    assert max([await answered_in(pacer, "10.0.0.1", 401) for _ in range(20)]) < 0.1
