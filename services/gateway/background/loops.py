"""What every background loop of the gateway shares: a step run every so often until the gateway stops (a failed
step is logged and run again at the next turn), and the loops' tasks ended with the cleanup context that began them."""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

from services.runtime.process.tasks import cancel_and_join

log = logging.getLogger(__name__)


async def every(interval_s: float, step: Callable[[], Awaitable[object]], what: str, *, at_once: bool = False) -> None:
    """Run `step` every `interval_s` (0: never; the first at once with `at_once`), logging one that fails as `what`."""
    if interval_s <= 0:
        return
    if not at_once:
        await asyncio.sleep(interval_s)
    while True:
        try:
            await step()
        except Exception:
            log.exception("%s failed; trying again in %.0fs", what, interval_s)
        await asyncio.sleep(interval_s)


@contextlib.asynccontextmanager
async def running(*loops: Coroutine[Any, Any, None]) -> AsyncIterator[None]:
    """The loops run as tasks while the block runs, then are cancelled and joined. A loop that dies is logged at
    once: never a gateway that silently stopped sweeping or seeing revocations."""
    tasks = [asyncio.create_task(loop, name=getattr(loop, "__qualname__", None)) for loop in loops]
    for task in tasks:
        task.add_done_callback(_log_failure)
    try:
        yield
    finally:
        await cancel_and_join(tasks)


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (error := task.exception()) is not None:
        log.error("background loop %s stopped: %r", task.get_name(), error, exc_info=error)
