"""The durables of an executor declared lost and silent for a week are deleted by the leading scheduler, so ids that
never come back do not fill WORK's consumers; a recently lost one keeps them (it may come back holding commands), and
one back again registers, which makes them again. On a real broker."""

import asyncio
import secrets

import nats.js.errors
import pytest

from contracts.subjects import WORK_STREAM, executor_durable, executor_finalize_durable
from services.runtime.nats.bus import EventBus
from services.scheduler.book import Book
from services.scheduler.durable_sweep import GONE_AFTER_MS, SWEEP_EVERY_MS, DurableSweep
from services.scheduler.registration import provide_durables
from tests.integration.test_executor_durables import registration

NOW_MS = 2_000_000_000_000


async def durables_of(bus: EventBus, executor_id: str) -> list[str]:
    held = []
    for name in (executor_durable(executor_id), executor_finalize_durable(executor_id)):
        try:
            held.append((await bus.js.consumer_info(WORK_STREAM, name)).name)
        except nats.js.errors.NotFoundError:
            pass
    return held


async def test_an_executor_silent_for_a_week_loses_its_durables_and_one_lost_lately_keeps_them(bus: EventBus) -> None:
    gone, lately = f"gone-{secrets.token_hex(3)}", f"lately-{secrets.token_hex(3)}"
    for executor_id in (gone, lately):
        await provide_durables(bus, executor_id, registration(executor_id, parallel=1))
    book = Book()
    book.lost.update({gone: NOW_MS - GONE_AFTER_MS - 1, lately: NOW_MS - GONE_AFTER_MS // 7})
    sweep = DurableSweep(bus, asyncio.Lock())
    await sweep.run(book, set(), NOW_MS)
    assert await durables_of(bus, gone) == []
    assert len(await durables_of(bus, lately)) == 2

    await provide_durables(bus, gone, registration(gone, parallel=1))  # it came back and registered
    del book.lost[gone]
    await sweep.run(book, set(), NOW_MS + SWEEP_EVERY_MS)
    assert len(await durables_of(bus, gone)) == 2


@pytest.mark.parametrize("since_ms", [0, SWEEP_EVERY_MS - 1])
async def test_a_sweep_runs_at_most_once_a_minute(bus: EventBus, since_ms: int) -> None:
    gone = f"gone-{secrets.token_hex(3)}"
    sweep = DurableSweep(bus, asyncio.Lock(), at_ms=NOW_MS)
    await provide_durables(bus, gone, registration(gone, parallel=1))
    book = Book()
    book.lost[gone] = NOW_MS - GONE_AFTER_MS - 1
    await sweep.run(book, set(), NOW_MS + since_ms)
    assert len(await durables_of(bus, gone)) == 2


async def test_an_id_with_an_advert_or_registered_while_the_sweep_waits_keeps_its_durables(bus: EventBus) -> None:
    """Alive by its advert whatever the book says; and one whose registration holds the registrar's lock as the sweep
    comes is read again after it: registered (no longer lost), it keeps the durables its registration just made."""
    advertised, registering = f"adv-{secrets.token_hex(3)}", f"reg-{secrets.token_hex(3)}"
    book, lock = Book(), asyncio.Lock()
    for executor_id in (advertised, registering):
        await provide_durables(bus, executor_id, registration(executor_id, parallel=1))
        book.lost[executor_id] = NOW_MS - GONE_AFTER_MS - 1
    async with lock:  # a registration of `registering` under way
        sweeping = asyncio.create_task(DurableSweep(bus, lock).run(book, {advertised}, NOW_MS))
        await asyncio.sleep(0.1)
        del book.lost[registering]  # the registration is stated: back in the fleet
    await sweeping
    assert len(await durables_of(bus, advertised)) == 2
    assert len(await durables_of(bus, registering)) == 2
