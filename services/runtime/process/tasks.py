"""Stopping background tasks for certain. On Python 3.11 `asyncio.wait_for` drops a cancel that lands in the same
tick as the reply it waits for (gh-86296), and nats-py waits for every reply so: a `while True` loop around a
request or a fetch may lose the one cancel meant to end it and run on, and a bare `gather` after it waits for ever.
`cancel_and_join` cancels again until each task has ended, within a bound."""

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

log = logging.getLogger(__name__)

RECANCEL_S = 2.0
"""How long a cancelled task gets to end (its own clean-up included) before it is cancelled again."""


async def cancel_and_join(tasks: Iterable["asyncio.Future[Any]"],
                          within_s: float = 10.0) -> "set[asyncio.Future[Any]]":
    """Cancel the tasks and wait until every one has ended, cancelling again those that lost a cancel; after
    `within_s` those still running are logged and returned (never waited for without end). Empty: all ended."""
    pending = {task for task in tasks if not task.done()}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=min(RECANCEL_S, max(0.0, deadline - loop.time())))
        if pending and loop.time() >= deadline:
            log.error("%d task(s) still running %.0fs after being cancelled: %s", len(pending), within_s,
                      ", ".join(sorted(repr(task) for task in pending)))
            return pending
    return pending
