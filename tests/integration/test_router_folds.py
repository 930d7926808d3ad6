"""Folds of the log declared on a ServiceRouter run by the router, against the real broker: a leader-only fold
for one term at a time on that term's dependencies, from the log's start, told once it caught up; only the facts
it declares reach it; it stops when its term (or the service's scope) ends."""

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from faststream.nats import NatsBroker

from contracts.events.batch import BatchReleased, LineRejected
from contracts.ids import new_batch_id
from services.ledger.app import create_app
from services.ledger.handlers import Folder
from services.ledger.settings import LedgerSettings
from services.runtime.nats.bus import EventBus
from services.runtime.nats.delivery import ServiceRouter
from services.runtime.nats.folds import LogFollower
from services.runtime.nats.follower import Fact
from services.runtime.process.settings import ConnectionSettings
from tests.conftest import RunningNats

WAIT_S = 10


@dataclass
class Tally:
    batch_ids: set[str]
    taken: list[int] = field(default_factory=list)
    subjects: set[str] = field(default_factory=set)
    caught_up: asyncio.Event = field(default_factory=asyncio.Event)
    grew: asyncio.Event = field(default_factory=asyncio.Event)


async def take(tally: Tally, facts: list[Fact], head_seen: int) -> None:
    tally.taken += [fact.sequence for fact in facts if fact.subject.split(".")[2] in tally.batch_ids]
    tally.subjects |= {fact.subject.rsplit(".", 1)[-1] for fact in facts}
    tally.grew.set()


def told(tally: Tally) -> None:
    tally.caught_up.set()


async def grown_to(tally: Tally, count: int) -> None:
    async with asyncio.timeout(WAIT_S):
        while len(tally.taken) < count:
            tally.grew.clear()
            await tally.grew.wait()


RELEASES = LogFollower("tests", (BatchReleased,), "Count releases.", take=take, caught_up=told, leader_only=True)
SERVICE_WIDE = LogFollower("tests-all", (BatchReleased,), "Count releases.", take=take, caught_up=told)


@asynccontextmanager
async def started(url: str, follower: LogFollower) -> AsyncIterator[tuple[NatsBroker, ServiceRouter, EventBus]]:
    """A broker running a router that declares `follower`."""
    bus = await EventBus.connect(url, "tests-folds")
    broker = bus.broker
    router = ServiceRouter("tests", dependencies="tests")
    router.follows(follower)
    broker.include_router(router)
    await broker.start()
    try:
        yield broker, router, bus
    finally:
        await broker.stop()


async def test_a_leader_only_fold_runs_for_each_term_on_its_dependencies_from_the_start(
        nats_server: RunningNats) -> None:
    async with started(nats_server.url, RELEASES) as (broker, router, bus):
        ids = [new_batch_id() for _ in range(3)]  # a release a batch: the same fact twice is one (deduplicated)
        first = await bus.publish(BatchReleased(aggregate_id=ids[0], released_by_key_id="key_a"))
        await bus.publish(LineRejected(aggregate_id=ids[0], line=1, code="invalid_json", message="not JSON"))
        term = Tally(set(ids))
        async with router.leading(broker, term, bus) as folds:
            await asyncio.wait_for(term.caught_up.wait(), WAIT_S)
            assert term.taken == [first] and term.subjects == {"released"}  # never the undeclared rejection
            later = await bus.publish(BatchReleased(aggregate_id=ids[1], released_by_key_id="key_b"))
            await grown_to(term, 2)
            assert term.taken == [first, later] and not folds.ended()
        assert folds.ended() and folds.failure() is None  # stopped with its term
        await bus.publish(BatchReleased(aggregate_id=ids[2], released_by_key_id="key_c"))
        await asyncio.sleep(0.2)
        assert len(term.taken) == 2
        next_term = Tally(set(ids))
        async with router.leading(broker, next_term, bus):  # a new term folds the whole log again
            await grown_to(next_term, 3)
            await asyncio.wait_for(next_term.caught_up.wait(), WAIT_S)


async def test_a_service_wide_fold_runs_in_its_scope_and_a_failing_handler_ends_it(nats_server: RunningNats) -> None:
    async with started(nats_server.url, SERVICE_WIDE) as (_, router, bus):
        batch_id = new_batch_id()
        tally = Tally({batch_id})
        async with router.folding(bus, tally) as folds:
            await asyncio.wait_for(tally.caught_up.wait(), WAIT_S)
            await bus.publish(BatchReleased(aggregate_id=batch_id, released_by_key_id="key_a"))
            await grown_to(tally, 1)
        assert folds.failure() is None

        async def fails(deps: Tally, facts: list[Fact], head_seen: int) -> None:
            raise RuntimeError("a fold's handler failed")

        failing = ServiceRouter("tests", dependencies="tests")
        failing.follows(LogFollower("tests-failing", (BatchReleased,), "Fail.", take=fails))
        async with failing.folding(bus, Tally({batch_id})) as folds:
            await asyncio.wait(folds.tasks, timeout=WAIT_S)
            assert isinstance(folds.failure(), RuntimeError)


async def test_a_ledger_whose_fold_fails_stops_with_the_error_instead_of_waiting_for_ever(
        fresh_nats: RunningNats, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bus = await EventBus.connect(fresh_nats.url, "tests")
    try:
        await bus.publish(BatchReleased(aggregate_id=new_batch_id(), released_by_key_id="key_a"))
    finally:
        await bus.close()

    async def broken(folder: Folder, facts: list[Fact]) -> None:
        raise RuntimeError("the fold's handler broke")

    monkeypatch.setattr(Folder, "receive", broken)
    app = create_app(LedgerSettings(connection=ConnectionSettings(nats_url=fresh_nats.url),
                                    db_path=tmp_path / "ledger.sqlite"))
    with pytest.raises(RuntimeError, match="handler broke"):
        await asyncio.wait_for(app.run(asyncio.Event()), 30)
