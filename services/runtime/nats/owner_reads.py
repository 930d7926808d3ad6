"""The read model's reads of one owner's lists: their index of batches, their live batches, their files and the bytes
they store; each a read or two of small entries, then the records by id."""

import asyncio
from collections import defaultdict
from collections.abc import Collection

from contracts.lifecycle import TERMINAL
from contracts.readmodel import BatchRecord, FileRecord, LiveBatches
from contracts.subjects import owner_index, owner_live_key, read_model_key
from services.runtime.nats.kv import (
    Bucket,
    latest_entries,
    latest_values,
    read_last,
    read_latest,
    read_value,
    replicated,
)
from services.runtime.nats.read_entries import BatchIndexEntry
from services.runtime.nats.records import Record, keyed_records, record, records
from services.runtime.nats.stored_bytes import part_of, stored_bytes_counting, stored_with_overflow


class OwnerReads:
    """Reads by owner (ReadModel has them, and the rest)."""

    def __init__(self, kv: Bucket) -> None:
        self.kv = kv

    async def _get(self, key: str, model: type[Record]) -> Record | None:
        raw = await read_latest(self.kv, key)
        return record(model, raw, key)

    async def get_batch(self, batch_id: str) -> BatchRecord | None:
        return await self._get(read_model_key("batch", batch_id), BatchRecord)

    async def get_batches(self, batch_ids: list[str]) -> dict[str, BatchRecord]:
        """The records of those of `batch_ids` the read model shows, by id, in batched reads. On a replicated bucket
        one the answering replica left out is asked of the leader: a batch written before the call is in the answer."""
        keys = [read_model_key("batch", batch_id) for batch_id in batch_ids]
        found = await read_last(self.kv, keys)
        missing = [key for key in keys if key not in found]
        if missing and await replicated(self.kv.js, self.kv.stream):
            values = await asyncio.gather(*(read_value(self.kv, key) for key in missing))
            found.update((key, value) for key, value in zip(missing, values, strict=True) if value)
        return {key.removeprefix("batch."): batch for key, batch in keyed_records(BatchRecord, found.items())}

    async def owner_batch_index(self, owner: str) -> list[BatchIndexEntry]:
        """The owner's index of batches (id and creation time of each), in id order: one scan of small entries."""
        values = await latest_values(self.kv, owner_index(owner, "batch"))
        return records(BatchIndexEntry, values, owner_index(owner, "batch"))

    async def every_batch_index(self) -> dict[str, list[BatchIndexEntry]]:
        """Every owner's index of batches, by owner: one scan of the small entries, none of the records."""
        indexes: defaultdict[str, list[BatchIndexEntry]] = defaultdict(list)
        for key, entry in keyed_records(BatchIndexEntry, await latest_entries(self.kv, owner_index("*", "batch"))):
            indexes[key.split(".")[1]].append(entry)
        return dict(indexes)

    async def owner_batches(self, owner: str) -> list[BatchRecord]:
        """Every batch of one owner (a user, or a key without one) in id order: their index, then its records (an
        entry whose record is not readable yet is left out, as is a record another owner holds)."""
        ids = [entry.id for entry in await self.owner_batch_index(owner)]
        records = await self.get_batches(ids)
        return [records[batch_id] for batch_id in ids if batch_id in records and records[batch_id].owner == owner]

    async def owner_live_list(self, owner: str) -> dict[str, str]:
        """Batch id → input file id of the owner's batches that have not ended, in one read. A batch is listed before
        its record shows it and leaves before its record shows it ended. An owner with no list yet (no batch, or a
        read model made before the lists): from their index of batches."""
        live = await self._live_list(owner)
        if live is None:
            live = {r.batch.id: r.batch.input_file_id for r in await self.owner_batches(owner)
                    if r.batch.status not in TERMINAL}
        return live

    async def _live_list(self, owner: str) -> dict[str, str] | None:
        """The owner's live list as written (None: never), every write acknowledged before the read in it."""
        raw = await read_value(self.kv, owner_live_key(owner))
        live = record(LiveBatches, raw, owner_live_key(owner))
        return live.root if live is not None else None

    async def owner_live_batches(self, owner: str, input_file_id: str | None = None,
                                 live: dict[str, str] | None = None) -> list[BatchRecord]:
        """The records of the owner's batches that have not ended (those the read model shows yet); with
        `input_file_id`, only those reading that file. `live`: the owner's live list if the caller just read it."""
        live = await self.owner_live_list(owner) if live is None else live
        ids = sorted(batch_id for batch_id, file_id in live.items() if input_file_id in (None, file_id))
        records = await asyncio.gather(*(self.get_batch(batch_id) for batch_id in ids))
        return [record for record in records if record is not None and record.batch.status not in TERMINAL]

    async def owner_files(self, owner: str) -> list[FileRecord]:
        """The owner's files that are not deleted (expired ones included), from their index alone."""
        return records(FileRecord, await latest_values(self.kv, owner_index(owner, "file")), owner_index(owner, "file"))

    async def owner_stored_bytes(self, owner: str, now: float) -> int:
        """The bytes of the owner's files that are neither deleted nor expired (one read while none is expired); with
        no summary yet (no file, or a read model made before them), counted from their index of files."""
        return (await self.owner_stored_files(owner, (), now))[0]

    async def owner_stored_files(self, owner: str, parts: Collection[str], now: float
                                 ) -> tuple[int, dict[str, frozenset[str]]]:
        """`owner_stored_bytes`, and the files it counts of each of `parts` (their SHA-256's first two hex digits):
        a file of one of them is in the total exactly when it is in its set (`stored_bytes_counting`)."""
        found = await stored_bytes_counting(self.kv, owner, parts, now)
        if found is not None:
            return found
        counted = [r for r in await self.owner_files(owner) if r.file.expires_at is None or r.file.expires_at > now]
        return sum(r.file.bytes for r in counted), {
            part: frozenset(r.file.id for r in counted if part_of(r.sha256) == part) for part in parts}

    async def owner_file_ids_by_sha256(self, owner: str, sha256: str) -> list[str]:
        """The ids of the owner's files with these bytes that are not deleted (one read, however many files)."""
        parts = await stored_with_overflow(self.kv, owner, part_of(sha256))
        return [file_id for files in parts for file_id, (_, _, digest) in files.root.items() if digest == sha256]
