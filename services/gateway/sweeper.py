"""The expired-file sweeper: every gateway deletes files past their `expires_at`, idempotently.

Expired files are already invisible to the API (views check `expires_at`); sweeping publishes the `file.deleted`
fact and frees the bytes. Gateways racing on one file publish the same fact id, which the stream deduplicates.
"""

import asyncio
import logging
import time
from collections.abc import AsyncIterator

from aiohttp import web

from services.gateway.context import DEPS, Deps
from services.gateway.views.files import delete_unless_in_use, is_expired
from services.runtime.tasks import cancel_and_join

log = logging.getLogger(__name__)


async def sweep_expired_files(d: Deps, now: float | None = None) -> list[str]:
    """Delete every expired file that no unfinished batch reads; the ids deleted."""
    now = time.time() if now is None else now
    swept: list[str] = []
    for record in await d.read_model.list_files():
        if record.deleted or not is_expired(record, now):
            continue
        if await delete_unless_in_use(d, record) is None:
            swept.append(record.file.id)
        # else a batch still reads it: swept once the batch ends
    if swept:
        log.info("swept %d expired files", len(swept))
    return swept


async def file_sweeper(app: web.Application) -> AsyncIterator[None]:
    """A cleanup context: sweeps every `file_sweep_interval_s` while the gateway runs."""
    interval = app[DEPS].settings.file_sweep_interval_s

    async def loop() -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await sweep_expired_files(app[DEPS])
            except Exception:
                log.exception("file sweep failed; trying again in %.0fs", interval)

    task = asyncio.create_task(loop()) if interval > 0 else None
    yield
    if task is not None:
        await cancel_and_join([task])
