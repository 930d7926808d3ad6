"""Folds of the log declared on a service's router (`ServiceRouter.follows`) and run by it, while the service runs or,
leader-only, for one term: each reads EVENTS in order from a sequence of its own through the gap-detecting ordered
reader (follower.py, which faststream has no form for) and hands its facts to its handler in groups."""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from contracts.events.envelope import Event
from contracts.subjects import EVENTS_SUBJECTS, event_subject
from services.runtime.nats import eventlog
from services.runtime.nats.bus import EventBus
from services.runtime.nats.follower import Fact, OrderedReader
from services.runtime.process.tasks import cancel_and_join

log = logging.getLogger(__name__)

STOP_S = 10.0
"""How long a fold's reader may take to stop once its scope ends."""


async def _from_the_start(deps: Any) -> int:
    return 0


@dataclass(frozen=True)
class LogFollower:
    """A fold of the log: the facts it takes (the server sends only those), its handler, where it resumes, and
    whom it tells once it has caught up with the log as it was when it started."""

    name: str
    contracts: tuple[type[Event], ...]
    description: str
    take: Callable[[Any, list[Fact], int], Awaitable[None]] | None = None
    """The handler: (the dependencies it runs on, a group of facts in stream order, the stream's last sequence as
    the reader last saw it: for lag). None: run by hand."""
    start_after: Callable[[Any], Awaitable[int]] = _from_the_start
    """The sequence it resumes after (a checkpoint); the log's start by default."""
    caught_up: Callable[[Any], None] | None = None
    """Called once every fact on its filters when it started is taken (at once when there is none)."""
    leader_only: bool = False
    """Run for each leadership term (`ServiceRouter.leading`), on that term's dependencies; else while the
    service runs (`ServiceRouter.folding`)."""
    group_size: int = 1000
    """Facts asked of the server at a time (two such pulls in flight at most)."""
    every_fact: bool = False
    """Read every fact of the log, not only its contracts' (the ledger's hash chain covers them all)."""

    @property
    def subjects(self) -> tuple[str, ...]:
        """The stream filters its reader asks for: each contract's facts, whatever their aggregate."""
        if self.every_fact or not self.contracts:
            return (EVENTS_SUBJECTS,)
        return tuple(event_subject(contract.kind, "*", contract.name) for contract in self.contracts)


async def run_fold(follower: LogFollower, bus: EventBus, deps: Any) -> None:
    """Hand the follower's facts to its handler, for ever (the reader restarts itself after broker trouble); a
    handler that raises ends the fold with its error."""
    take = follower.take
    assert take is not None
    after = await follower.start_after(deps)
    subjects = follower.subjects
    head = await eventlog.head(bus, () if subjects == (EVENTS_SUBJECTS,) else subjects)
    reached = head <= after
    if reached and follower.caught_up is not None:
        follower.caught_up(deps)
    reader = OrderedReader(bus, after, follower.group_size, subjects)
    async with reader.reading() as groups:
        async for facts in groups:  # until cancelled
            await take(deps, facts, reader.head_seen)
            if not reached and facts[-1].sequence >= head:
                reached = True
                if follower.caught_up is not None:
                    follower.caught_up(deps)


@dataclass(frozen=True)
class Folds:
    """The folds running in one scope: whoever runs in it can watch them end (only a failure ends one)."""

    tasks: tuple["asyncio.Task[None]", ...]

    def ended(self) -> bool:
        return any(task.done() for task in self.tasks)

    def failure(self) -> BaseException | None:
        """The error a fold ended with, if one did."""
        for task in self.tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                return task.exception()
        return None


@contextlib.asynccontextmanager
async def running(followers: list[LogFollower], bus: EventBus, deps: Any) -> AsyncIterator[Folds]:
    """The followers' folds, each in a task, until the block ends (then stopped, on every path)."""
    tasks = tuple(asyncio.create_task(run_fold(follower, bus, deps), name=f"fold {follower.name}")
                  for follower in followers)
    try:
        yield Folds(tasks)
    finally:
        if await cancel_and_join(tasks, STOP_S):
            log.error("a fold did not stop within %.0fs", STOP_S)
