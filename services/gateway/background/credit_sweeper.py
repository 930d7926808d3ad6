"""Credit run out mid-batch: every few seconds, each billed batch of an account below zero is told to stop, its lines
not yet run ending `insufficient_credits` (a negative grant, or usage past its bound; what ran stays charged).
Gateways racing on one batch publish the same fact id, which the stream deduplicates."""

import logging
from collections.abc import AsyncIterator

from aiohttp import web

from services.gateway.background.loops import every, running
from services.gateway.context import DEPS, Deps
from services.gateway.usecases.revocation import ENDED, stop_batch

log = logging.getLogger(__name__)

SWEPT_BY = "billing"
"""The `requested_by_key_id` of a cancel for credit run out: no key asked for it."""


async def stop_unpaid_batches(d: Deps) -> list[str]:
    """Tell every live billed batch of an overdrawn account to stop; the ids told."""
    told: list[str] = []
    for account in await d.read_model.overdrawn_accounts():
        for batch_id in account.open_batch_ids:
            record = await d.read_model.get_batch(batch_id)
            if record is None or record.batch.status in ENDED:
                continue
            if await stop_batch(d.bus, batch_id, SWEPT_BY, "insufficient_credits"):
                told.append(batch_id)
    if told:
        log.warning("stopped %d batches whose organisation's balance ran out: %s", len(told), ", ".join(told))
    return told


async def credit_sweeper(app: web.Application) -> AsyncIterator[None]:
    """A cleanup context: with billing on, sweeps every `credit_sweep_interval_s` while the gateway runs."""
    d = app[DEPS]
    interval = d.settings.credit_sweep_interval_s if d.settings.billing else 0
    async with running(every(interval, lambda: stop_unpaid_batches(d), "credit sweep")):
        yield
