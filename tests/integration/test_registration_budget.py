"""Registrations of one executor id are stored at most `REGISTRATIONS_PER_HOUR` times in any hour, with an advert of at
most `MAX_ADVERT_BYTES` (each is a fact in the log, kept for good): past the budget the executor is told to retry, and
is accepted again once an hour has gone by since the oldest; a larger advert is refused. On a real broker, through the
scheduler's registrar."""

import asyncio
from pathlib import Path

from contracts.commands import ExecutorRegistration
from services.scheduler.book import Book
from services.scheduler.registration import HOUR_MS, REGISTRATION_INTERVAL_MS, REGISTRATIONS_PER_HOUR, Registrar
from tests.integration.authorized_broker import WORKER_KEY, admitting_broker
from tests.integration.test_scheduler_fleet import advert


async def test_an_id_registering_past_its_hourly_budget_is_told_to_retry_until_the_hour_frees_one(
        tmp_path: Path) -> None:
    clock = {"s": 1_900_000_000.0}
    async with admitting_broker(tmp_path) as running:
        caught_up = asyncio.Event()
        caught_up.set()
        registrar = Registrar(running.core, running.read_model, Book(), caught_up, clock=lambda: clock["s"])
        request = ExecutorRegistration(executor_id="looping", worker_key=WORKER_KEY, advert=advert("looping"))
        answers = []
        for _ in range(REGISTRATIONS_PER_HOUR + 1):
            clock["s"] += REGISTRATION_INTERVAL_MS / 1000 + 1
            answers.append(await registrar.answer("looping", request))
        assert [a.accepted for a in answers] == [True] * REGISTRATIONS_PER_HOUR + [False]
        assert answers[-1].retry and "in the last hour" in (answers[-1].reason or "")
        clock["s"] += HOUR_MS / 1000 - REGISTRATIONS_PER_HOUR * (REGISTRATION_INTERVAL_MS / 1000 + 1)
        assert (await registrar.answer("looping", request)).accepted


async def test_an_advert_larger_than_any_real_one_is_refused(tmp_path: Path) -> None:
    async with admitting_broker(tmp_path) as running:
        caught_up = asyncio.Event()
        caught_up.set()
        registrar = Registrar(running.core, running.read_model, Book(), caught_up)
        bloated = advert("bloated").model_copy(update={"models": [f"m{n:03d}-{'x' * 240}" for n in range(200)]})
        answer = await registrar.answer("bloated", ExecutorRegistration(executor_id="bloated", worker_key=WORKER_KEY,
                                                                        advert=bloated))
        assert not answer.accepted and not answer.retry and "larger than" in (answer.reason or "")
        assert (await registrar.answer("bloated", ExecutorRegistration(
            executor_id="bloated", worker_key=WORKER_KEY, advert=advert("bloated")))).accepted
