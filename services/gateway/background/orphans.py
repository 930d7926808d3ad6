"""The orphaned-object sweep: a file's object that no `stored` fact ever stated (an upload whose fact the broker did
not take; a finalize that died between writing an output file and stating it, and was never done again), or whose
file's `deleted` fact is stored while the object's removal failed, is removed once older than any batch could still
need it. The log decides, never the read model: a file exists from its `stored` fact until its `deleted` fact."""

import logging
import time
from collections.abc import AsyncIterator

from aiohttp import web

from contracts.subjects import file_fact, input_object_key
from services.gateway.background.loops import every, running
from services.gateway.context import DEPS, Deps
from services.gateway.usecases.batches import MAX_WINDOW_S
from services.gateway.usecases.files import is_valid_id, stated_file
from services.runtime.nats.facts import last_fact

log = logging.getLogger(__name__)

ORPHAN_AGE_S = MAX_WINDOW_S + 24 * 3600
"""An object younger than this is never swept: the longest completion window and a day for its finalize."""
LIST_PAGE = 1000
"""Objects listed (and held) at once."""


async def is_orphaned(d: Deps, file_id: str, object_key: str) -> bool:
    """Whether the log holds no file for this object: none was stated (or another object was, as with a retry's copy
    made twice at once), or the file was deleted."""
    if await last_fact(d.bus, file_fact(file_id, "deleted")) is not None:
        return True
    stated = await stated_file(d, file_id)
    return stated is None or stated[1].object_key != object_key


async def sweep_orphaned_objects(d: Deps, now: float | None = None) -> list[str]:
    """Remove every file object older than `ORPHAN_AGE_S` that the log holds no file for; the keys removed."""
    now = time.time() if now is None else now
    prefix, after, removed = input_object_key(""), "", []
    while True:
        page = await d.store.list_page(prefix, after, LIST_PAGE)
        for key, written_at in page:
            file_id = key[len(prefix):].split(".", 1)[0]  # `<file id>` or `<file id>.<request's own>`
            # A name no file id has is not ours to judge (nor a subject to read).
            if now - written_at >= ORPHAN_AGE_S and is_valid_id(file_id) and await is_orphaned(d, file_id, key):
                await d.store.remove(key)
                removed.append(key)
        if len(page) < LIST_PAGE:
            break
        after = page[-1][0]
    if removed:
        log.info("removed %d objects no file holds (older than %d days)", len(removed), ORPHAN_AGE_S // 86400)
    return removed


async def orphan_sweeper(app: web.Application) -> AsyncIterator[None]:
    """A cleanup context: sweeps every `orphan_sweep_interval_s` while the gateway runs."""
    async with running(every(app[DEPS].settings.orphan_sweep_interval_s, lambda: sweep_orphaned_objects(app[DEPS]),
                             "orphaned-object sweep")):
        yield
