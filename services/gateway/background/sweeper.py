"""The expired-file sweeper: every gateway deletes files past their `expires_at`, idempotently (racing gateways
publish the same fact id). A sweep finds them from the owners' stored-bytes summaries (each part's earliest expiry):
only the parts holding an expired file are read, then only those files' records, never every file record ever stored
(deleted files and every batch's result files stay in the read model for good). Once a day a sweep also pages through
every record (one page held at a time, only expired ones decoded whole): a file the summaries miss (a part too full
to list it) is still swept."""

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator

from aiohttp import web
from pydantic import BaseModel

from contracts.readmodel import FileRecord, StoredBytes
from contracts.subjects import owner_stored_key, read_model_key
from services.gateway.background.loops import every, running
from services.gateway.context import DEPS, Deps
from services.gateway.usecases.files import delete_unless_in_use
from services.runtime.nats.kv import latest_entries, read_page
from services.runtime.nats.stored_bytes import stored_part

log = logging.getLogger(__name__)

FULL_SWEEP_S = 86400.0
"""How often a gateway's sweep reads every file record (the backstop of the summaries)."""
FIRST_FULL_SWEEP_S = 3600.0
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
    """Every expired file record not deleted that the owners' summaries list: each part whose earliest expiry has
    come is read, and each of its expired files' records."""
    kv = d.read_model.kv
    for key, raw in await latest_entries(kv, owner_stored_key("*")):
        owner = key.split(".")[1]
        for part, (_, earliest) in StoredBytes.model_validate_json(raw).root.items():
            if earliest is None or earliest > now:
                continue
            for file_id, (_, expires_at, _) in (await stored_part(kv, owner, part)).root.items():
                if expires_at is not None and expires_at <= now:
                    record = await d.read_model.get_file(file_id)
                    if record is not None and not record.deleted:
                        yield record


async def every_expired_file(d: Deps, now: float) -> AsyncIterator[FileRecord]:
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


async def sweep_expired_files(d: Deps, now: float | None = None, *, every_record: bool = False) -> list[str]:
    """Delete every expired file that no unfinished batch reads (found from the summaries, or with `every_record`
    from every file record); the ids deleted."""
    now = time.time() if now is None else now
    found = every_expired_file(d, now) if every_record else expired_files(d, now)
    # One a batch still reads is swept once the batch ends.
    swept = [record.file.id async for record in found if await delete_unless_in_use(d, record) is None]
    if swept:
        log.info("swept %d expired files", len(swept))
    return swept


async def file_sweeper(app: web.Application) -> AsyncIterator[None]:
    """A cleanup context: sweeps every `file_sweep_interval_s` while the gateway runs, and through every file record
    once a day."""
    d = app[DEPS]
    interval = d.settings.file_sweep_interval_s
    async with running(every(interval, lambda: sweep_expired_files(d), "file sweep"),
                       *([full_sweeps(d)] if interval > 0 else [])):
        yield


async def full_sweeps(d: Deps) -> None:
    """The sweeps through every file record: the first at a random moment within `FIRST_FULL_SWEEP_S` of the start
    (a gateway restarted more often than daily still runs one; gateways started together spread theirs), then
    every `FULL_SWEEP_S`."""
    await asyncio.sleep(random.uniform(0, FIRST_FULL_SWEEP_S))
    await every(FULL_SWEEP_S, lambda: sweep_expired_files(d, every_record=True), "full file sweep", at_once=True)
