"""The scheduler's answers to executors are a leader's: a standby answers no registration, object request or desk
request (an executor gets "no responders" at once, not a timeout); the scheduler that wins the lease answers them,
and stops answering when it loses the lease."""

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import nats.errors
import pytest

from contracts.commands import RegistrationAnswer
from contracts.fact_desk import FactReceipt, LogPage
from contracts.objects import ObjectGrant
from contracts.subjects import (
    SCHEDULER_LEADER_KEY,
    fact_submissions,
    fleet_registrations,
    log_reads,
    object_requests,
)
from services.runtime.nats.bus import EventBus
from services.runtime.nats.leader import LeaderLease
from services.runtime.process.settings import ConnectionSettings
from services.scheduler.app import run_scheduler
from services.scheduler.settings import SchedulerSettings
from tests.conftest import RunningNats

TTL_S = 2.0
ASKS = {fleet_registrations("exec-1"): b'{"executor_id": "exec-1"}', object_requests("exec-1"): b'{"batch_id": "b"}',
        fact_submissions("exec-1"): b'{"event": "{}"}', log_reads("exec-1"): b'{"batch_id": "b"}'}
"""One request to each answer, each as a careless executor would send it."""


@asynccontextmanager
async def scheduler(url: str) -> AsyncIterator[None]:
    settings = SchedulerSettings(connection=ConnectionSettings(nats_url=url), tick_s=0.2, leader_ttl_s=TTL_S)
    stop = asyncio.Event()
    task = asyncio.create_task(run_scheduler(settings, stop))
    try:
        yield
        assert not task.done(), "the scheduler stopped by itself"
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 15)


@asynccontextmanager
async def kept(lease: LeaderLease) -> AsyncIterator[None]:
    """The lease renewed while the block runs, as the scheduler holding it would: left alone it expires after its
    TTL, and the scheduler under test then rightly takes it (and answers) while the test expects a standby."""
    stop = asyncio.Event()
    keeper = asyncio.create_task(lease.keep(stop))
    try:
        yield
        assert not keeper.done(), "the other scheduler lost its lease"
    finally:
        stop.set()
        await keeper


async def answered(bus: EventBus, subject: str) -> bytes | None:
    """The answer to one request; None when nobody is there to answer."""
    try:
        return (await bus.nc.request(subject, ASKS[subject], timeout=2)).data
    except nats.errors.NoRespondersError:
        return None


async def until(bus: EventBus, answering: bool, within_s: float = 10.0) -> None:
    """Until every answer is given (or none is). A request that meets a term as it ends times out: the server
    routed it to a subscription being removed; that is the moment of handing over, asked again."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            if [await answered(bus, subject) is not None for subject in ASKS] == [answering] * len(ASKS):
                return
        except nats.errors.TimeoutError:
            pass
        assert time.monotonic() < deadline, f"still {'not ' if answering else ''}answering after {within_s}s"
        await asyncio.sleep(0.2)


async def settled(bus: EventBus, subject: str, within_s: float = 30.0) -> bytes:
    """The fact desk's answer once its book has read the log: until then it answers `retry` (a new leader reads
    the whole log before it judges a fact or a read), and an executor asks again, as this does."""
    deadline = time.monotonic() + within_s
    while True:
        answer = await answered(bus, subject) or b""
        if json.loads(answer or b"{}").get("status") != "retry":
            return answer
        assert time.monotonic() < deadline, f"the desk still catching up after {within_s}s"
        await asyncio.sleep(0.2)


@pytest.fixture
async def bus(fresh_nats: RunningNats) -> AsyncIterator[EventBus]:
    bus = await EventBus.connect(fresh_nats.url, "tests")
    yield bus
    await bus.close()


async def test_a_standby_answers_nothing_and_the_scheduler_that_wins_the_lease_answers_until_it_loses_it(
        bus: EventBus, fresh_nats: RunningNats) -> None:
    other = await LeaderLease.open(bus, TTL_S)
    assert await other.acquire(asyncio.Event())  # another scheduler leads
    async with scheduler(fresh_nats.url):
        async with kept(other):
            await asyncio.sleep(TTL_S)  # up, and asking for the lease in vain
            for subject in ASKS:
                assert await answered(bus, subject) is None, subject

        await other.release()
        await until(bus, answering=True)
        # Malformed requests get their answer's refusal, never silence.
        registration = await answered(bus, fleet_registrations("exec-1"))
        assert RegistrationAnswer.model_validate_json(registration or b"").reason == (
            "Malformed registration: Field required")
        grant = ObjectGrant.model_validate_json(await answered(bus, object_requests("exec-1")) or b"")
        assert not grant.granted and (grant.reason or "").startswith("Malformed object request: ")
        receipt = FactReceipt.model_validate_json(await settled(bus, fact_submissions("exec-1")))
        assert receipt.status == "refused" and (receipt.reason or "").startswith("Not a fact: ")
        page = LogPage.model_validate_json(await settled(bus, log_reads("exec-1")))
        assert page.status == "refused"  # exec-1 holds no batch b

        await other.kv.delete(SCHEDULER_LEADER_KEY)
        assert await other.acquire(asyncio.Event())  # the lease moves on under the leader: its renewal fails
        async with kept(other):
            await until(bus, answering=False, within_s=30.0)  # a loaded machine's scheduler ends its term late
        await other.release()
