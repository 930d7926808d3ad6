"""The fleet-wide gauges (batches per status, the queue, consumer lag, live executors), refreshed on a timer.

A scrape of `/metrics` only renders what the last refresh set: it reads nothing from NATS, so its cost does not grow
with the batches in the read model however often it comes. The refresh reads every batch record (and the consumers
and executors) once per `metrics_refresh_s` per gateway, whoever scrapes or not.
"""

import asyncio
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from services.gateway.context import DEPS, Deps
from services.runtime.overview import export_gauges, gather
from services.runtime.tasks import cancel_and_join

log = logging.getLogger(__name__)


async def refresh_gauges(d: Deps) -> None:
    """One look at the fleet, set into the gauges (owners' shares are not gauges: not read)."""
    export_gauges(await gather(d.bus, d.read_model, d.fleet, owners=False))


async def fleet_gauges(app: web.Application) -> AsyncIterator[None]:
    """A cleanup context: refreshes once before serving, then every `metrics_refresh_s` (0: never)."""
    d = app[DEPS]
    interval = d.settings.metrics_refresh_s

    async def refresh() -> None:
        try:
            await refresh_gauges(d)
        except Exception:
            log.exception("fleet gauges not refreshed; trying again in %.0fs", interval)

    async def loop() -> None:
        while True:
            await asyncio.sleep(interval)
            await refresh()

    task = None
    if interval > 0:
        await refresh()
        task = asyncio.create_task(loop())
    yield
    if task is not None:
        await cancel_and_join([task])
