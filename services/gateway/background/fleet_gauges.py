"""The fleet-wide gauges (batches per status, queue, held and running batches, consumer lag, live executors), set
every `metrics_refresh_s` from the batch census's open batches, the adverts and the consumers; a scrape of `/metrics`
reads nothing from NATS, and neither grows with the batches that ended."""

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

from aiohttp import web

from services.gateway.background.batch_census import BatchCensus
from services.gateway.background.loops import every, running
from services.gateway.context import DEPS, Deps
from services.gateway.usecases.overview import census_view, consumer_lags, export_gauges

log = logging.getLogger(__name__)

BATCH_CENSUS = web.AppKey("batch_census", BatchCensus)
CENSUS_READY_S = 30.0
"""How long the first refresh waits for the census's first count (then it sets what it has)."""
CENSUS_WAIT_S = 2.0
"""How long a request (a quote, the operator's overview) waits for a starting gateway's census to have counted every
batch (then it says what it has)."""


async def counted_census(app: web.Application) -> BatchCensus:
    """The gateway's batch census, once it has counted every batch (or `CENSUS_WAIT_S` passed)."""
    census = app[BATCH_CENSUS]
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(census.ready.wait(), CENSUS_WAIT_S)
    return census


async def refresh_gauges(d: Deps, census: BatchCensus) -> None:
    """One look at the fleet, set into the gauges: no batch record is read."""
    view = census_view(census, await d.fleet.adverts(), time.time())
    view.consumers = await consumer_lags(d.bus)
    export_gauges(view)


async def fleet_gauges(app: web.Application) -> AsyncIterator[None]:
    """A cleanup context: the census (quotes read it too), and the gauges refreshed every `metrics_refresh_s` (0:
    never)."""
    d = app[DEPS]
    interval = d.settings.metrics_refresh_s
    census = app[BATCH_CENSUS] = BatchCensus()

    async def loop() -> None:
        try:
            await asyncio.wait_for(census.ready.wait(), CENSUS_READY_S)
        except TimeoutError:
            log.warning("the batch census has not counted within %.0fs; the gauges show what it has", CENSUS_READY_S)
        await every(interval, lambda: refresh_gauges(d, census), "fleet gauges refresh", at_once=True)

    async with running(census.follow(d.read_model.kv), *([loop()] if interval > 0 else [])):
        yield
