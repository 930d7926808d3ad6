"""A page of a list of batches: ordered newest first from the owners' index entries alone, then only the records the
page needs read by id (with a filter, as many as it takes to fill the page), however many batches the owners had."""

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from contracts.api.batch import Batch
from contracts.api.page import ListPage
from contracts.readmodel import BatchRecord
from services.gateway.http.paging import page_after
from services.runtime.nats.read_entries import BatchIndexEntry
from services.runtime.nats.readmodel import ReadModel

FILTERED_READ = 100
"""Records read at a time while a filter fills a page (fewer round trips when few match)."""


@dataclass(frozen=True)
class Listing:
    entries: list[BatchIndexEntry]
    records: Callable[[list[BatchIndexEntry]], Awaitable[list[BatchRecord]]]
    """The records of some of `entries`, in their order (an entry whose record is not readable is left out)."""


def indexed(read_model: ReadModel, indexes: dict[str, list[BatchIndexEntry]]) -> Listing:
    """The batches in these owners' indexes (owner → entries); a record that another owner holds is left out."""
    owners = {entry.id: owner for owner, entries in indexes.items() for entry in entries}

    async def records(chunk: list[BatchIndexEntry]) -> list[BatchRecord]:
        found = await read_model.get_batches([entry.id for entry in chunk])
        return [found[e.id] for e in chunk if e.id in found and found[e.id].owner == owners[e.id]]

    return Listing([entry for entries in indexes.values() for entry in entries], records)


async def batch_page(listing: Listing, after: str | None, limit: int,
                     keep: Callable[[Batch], bool] | None = None) -> ListPage[Batch]:
    """OpenAI's list page of the batches `keep` keeps (None: all), newest first, the `limit` after `after`."""
    entries = sorted(listing.entries, key=lambda entry: (entry.created_at, entry.id), reverse=True)
    ids = [entry.id for entry in entries]
    at = 0 if after is None else ids.index(after) if after in ids else len(entries)
    wanted = limit + 1 + (after is not None)  # `after` itself (page_after finds it, or refuses), the page, one more
    batches: list[Batch] = []
    while at < len(entries) and len(batches) < wanted:
        chunk = entries[at:at + max(wanted - len(batches), FILTERED_READ if keep else 0)]
        at += len(chunk)
        batches += [r.batch for r in await listing.records(chunk) if keep is None or keep(r.batch)]
    return page_after(batches, [batch.id for batch in batches], after, limit)
