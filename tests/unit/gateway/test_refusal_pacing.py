"""Refusal pacing: a client past its budget of refusals gets its next refusals late; successes, other errors and
other clients are never delayed, the budget comes back once the window has passed, and a client is an owner when
authenticated, an address (an IPv6 /64) when not."""

import asyncio
import time

import pytest
from aiohttp import web

from services.gateway.http.refusal_pacing import MAX_WAITING, Dropped, RefusalPacer, client_of


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


async def test_past_the_waiting_cap_a_refusal_is_dropped_without_an_answer() -> None:
    pacer = RefusalPacer(budget=1, window_s=60, delay_s=5)
    await answered_in(pacer, "10.0.0.1", 401)
    waiting = [asyncio.create_task(pacer.pace("10.0.0.1", web.Response(status=401))) for _ in range(MAX_WAITING)]
    await asyncio.sleep(0.05)

    with pytest.raises(Dropped):
        await pacer.pace("10.0.0.1", web.Response(status=401))

    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
    assert pacer.waiting == {}


def test_an_authenticated_caller_is_paced_as_its_owner_and_an_ipv6_address_by_its_64() -> None:
    assert client_of("203.0.113.7", "user-a") == client_of("198.51.100.1", "user-a") == "owner:user-a"
    assert client_of("203.0.113.7", None) != client_of("203.0.113.8", None)
    assert client_of("2001:db8:1:2::1", None) == client_of("2001:db8:1:2:ffff::9", None)
    assert client_of("2001:db8:1:2::1", None) != client_of("2001:db8:1:3::1", None)
    assert client_of("unknown", None) == "address:unknown"


def test_a_client_costs_two_numbers_however_many_refusals_it_got() -> None:
    pacer = RefusalPacer(budget=1000, window_s=60, delay_s=0)
    for _ in range(5000):
        pacer._count("address:10.0.0.1", 0.0)
    assert pacer.windows["address:10.0.0.1"] == (0.0, 5000)


async def test_a_budget_of_zero_turns_pacing_off() -> None:
    pacer = RefusalPacer(budget=0, window_s=60, delay_s=5)
    assert max([await answered_in(pacer, "10.0.0.1", 401) for _ in range(20)]) < 0.1
