"""A list of batches is ordered and paged from index entries, and reads only the records its page needs: newest
first, `after` and `limit` as OpenAI's, a filter filling the page, an entry with no readable record left out."""

import pytest

from contracts.api.batch import Batch, BatchStatus
from contracts.readmodel import BatchRecord
from services.gateway.usecases.batch_list import Listing, batch_page
from services.gateway.usecases.refusals import ApiError
from services.runtime.nats.read_entries import BatchIndexEntry, owner_entry

T0 = 1_700_000_000


def record(batch_id: str, created_at: int, status: BatchStatus = "completed") -> BatchRecord:
    batch = Batch(id=batch_id, endpoint="/v1/chat/completions", input_file_id="file-in", completion_window="24h",
                  status=status, created_at=created_at)
    return BatchRecord(owner_key_id="key-a", batch=batch, last_sequence=1)


class Reads:
    """A listing over known records that counts the records read (a record not in `readable` is not there yet)."""

    def __init__(self, records: list[BatchRecord], readable: set[str] | None = None) -> None:
        self.by_id = {r.batch.id: r for r in records}
        self.readable = set(self.by_id) if readable is None else readable
        self.read: list[str] = []
        self.listing = Listing([BatchIndexEntry(id=r.batch.id, created_at=r.batch.created_at) for r in records],
                               self._records)

    async def _records(self, chunk: list[BatchIndexEntry]) -> list[BatchRecord]:
        self.read += [entry.id for entry in chunk]
        return [self.by_id[entry.id] for entry in chunk if entry.id in self.readable]


def ids(batches: list[Batch]) -> list[str]:
    return [batch.id for batch in batches]


HISTORY = [record(f"batch_{n:03}", T0 + n // 2) for n in range(50)]  # pairs created in the same second


async def test_pages_run_newest_first_then_by_id_and_read_only_the_page_and_one_more() -> None:
    reads = Reads(HISTORY)
    first = await batch_page(reads.listing, None, 3)
    assert ids(first.data) == ["batch_049", "batch_048", "batch_047"] and first.has_more
    assert (first.first_id, first.last_id) == ("batch_049", "batch_047")
    assert len(reads.read) == 4
    second = await batch_page(reads.listing, first.last_id, 3)
    assert ids(second.data) == ["batch_046", "batch_045", "batch_044"] and second.has_more
    last = await batch_page(reads.listing, "batch_002", 3)
    assert ids(last.data) == ["batch_001", "batch_000"] and not last.has_more
    exact = await batch_page(reads.listing, "batch_003", 3)
    assert ids(exact.data) == ["batch_002", "batch_001", "batch_000"] and not exact.has_more


async def test_an_after_not_in_the_list_is_refused_and_the_end_is_an_empty_page() -> None:
    reads = Reads(HISTORY)
    with pytest.raises(ApiError) as refused:
        await batch_page(reads.listing, "batch_999", 3)
    assert refused.value.status == 400 and refused.value.body.code == "invalid_after"
    end = await batch_page(reads.listing, "batch_000", 3)
    assert end.data == [] and not end.has_more and end.first_id is None


async def test_a_filter_fills_the_page_and_an_after_it_does_not_keep_is_refused() -> None:
    records = [record(f"batch_{n:03}", T0 + n, "failed" if n % 10 == 0 else "completed") for n in range(50)]
    reads = Reads(records)

    def failed(batch: Batch) -> bool:
        return batch.status == "failed"

    page = await batch_page(reads.listing, None, 2, failed)
    assert ids(page.data) == ["batch_040", "batch_030"] and page.has_more
    rest = await batch_page(reads.listing, "batch_030", 2, failed)
    assert ids(rest.data) == ["batch_020", "batch_010"] and rest.has_more
    with pytest.raises(ApiError):
        await batch_page(reads.listing, "batch_031", 2, failed)


async def test_an_entry_whose_record_is_not_readable_yet_is_left_out() -> None:
    reads = Reads(HISTORY[:5], readable={"batch_000", "batch_001", "batch_003"})
    page = await batch_page(reads.listing, None, 2)
    assert ids(page.data) == ["batch_003", "batch_001"] and page.has_more


def test_an_index_entry_decodes_from_the_entry_and_from_a_whole_record_an_older_ledger_wrote() -> None:
    whole = HISTORY[7]
    entry = BatchIndexEntry(id=whole.batch.id, created_at=whole.batch.created_at)
    assert BatchIndexEntry.model_validate_json(whole.model_dump_json()) == entry
    assert BatchIndexEntry.model_validate_json(entry.model_dump_json()) == entry == owner_entry(whole)
