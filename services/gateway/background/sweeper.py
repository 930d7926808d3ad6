"""The expired-file sweeper: every gateway deletes files past their `expires_at`, idempotently (racing gateways
publish the same fact id). A sweep holds one page of file records at a time and decodes whole only expired ones:
decoding every record ever stored each minute made the gateway's memory peak grow with them."""

import logging
import time
from collections.abc import AsyncIterator

from aiohttp import web
from pydantic import BaseModel

from contracts.readmodel import FileRecord
from contracts.subjects import read_model_key
from services.gateway.background.loops import every, running
from services.gateway.context import DEPS, Deps
from services.gateway.usecases.files import delete_unless_in_use
from services.runtime.nats.kv import read_page

log = logging.getLogger(__name__)

SWEEP_PAGE = 500
"""File records read (and held) at once by a sweep."""
SWEEP_PAGE_BYTES = 4 << 20


class _Expiry(BaseModel):
    expires_at: int | None = None


class _Sweepable(BaseModel):
    """What a sweep reads of every file record (the rest of it is skipped while decoding)."""

    deleted: bool = False
    file: _Expiry


async def expired_files(d: Deps, now: float) -> AsyncIterator[FileRecord]:
    """Every expired file record not deleted, page by page (one rewritten meanwhile comes at the end: none missed)."""
    kv = d.read_model.kv
    after = 0
    while True:
        page, more = await read_page(kv.js, kv.stream, f"{kv.prefix}{read_model_key('file', '>')}", after,
                                     SWEEP_PAGE, SWEEP_PAGE_BYTES)
        for message in page:
            if not message.value:
                continue
            seen = _Sweepable.model_validate_json(message.data)
            if not seen.deleted and seen.file.expires_at is not None and seen.file.expires_at <= now:
                yield FileRecord.model_validate_json(message.data)
        if not page or not more:
            return
        after = page[-1].seq


async def sweep_expired_files(d: Deps, now: float | None = None) -> list[str]:
    """Delete every expired file that no unfinished batch reads; the ids deleted."""
    now = time.time() if now is None else now
    # One a batch still reads is swept once the batch ends.
    swept = [record.file.id async for record in expired_files(d, now) if await delete_unless_in_use(d, record) is None]
    if swept:
        log.info("swept %d expired files", len(swept))
    return swept


async def file_sweeper(app: web.Application) -> AsyncIterator[None]:
    """A cleanup context: sweeps every `file_sweep_interval_s` while the gateway runs."""
    async with running(every(app[DEPS].settings.file_sweep_interval_s, lambda: sweep_expired_files(app[DEPS]),
                             "file sweep")):
        yield
