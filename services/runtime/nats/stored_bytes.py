"""Each owner's stored bytes, kept by the read model's writer beside the file records: the owner's undeleted files in
parts by the first two hex digits of their SHA-256 (`StoredFiles`), and each part's bytes and earliest expiry
(`StoredBytes`). Both are states, not counters (a record put again changes nothing), written before the record shows
the change, so a reader that sees the record sees the bytes counted."""

import asyncio
import logging
import re
from collections import OrderedDict, defaultdict
from collections.abc import Collection, Iterable, Mapping
from typing import TypeVar

from contracts.readmodel import FileRecord, StoredBytes, StoredFiles
from contracts.subjects import owner_stored_key, owner_stored_part_key
from services.runtime.nats.kv import Bucket, read_value
from services.runtime.nats.records import record as decoded
from services.runtime.process.keyed_locks import KeyedLocks

MAX_HELD = 50_000
"""Parts and summaries the writer keeps; past this the least recently used are read again when next changed."""
MAX_PART_BYTES = 512 * 1024
"""The largest part written (about 4,400 files): a part is one KV value and a tenant chooses its files' digests, so a
part past this goes on in overflow parts (`overflow_chain`), never left uncounted: its files count against the quota."""
NEARLY_FULL_BYTES = 4096
"""A part within this of `MAX_PART_BYTES` may have gone on in overflow parts (an entry is far smaller)."""
UNSORTED_PART = "xx"
"""The part of a digest that is not hex (never an upload's, which the gateway computes): a key stays a valid key."""
Stored = TypeVar("Stored", StoredFiles, StoredBytes)
Value = TypeVar("Value")
log = logging.getLogger(__name__)
_HEX_PAIR = re.compile(r"[0-9a-f]{2}")


def part_of(sha256: str) -> str:
    """The part a digest's files are kept in: its first two hex digits."""
    return sha256[:2] if _HEX_PAIR.match(sha256) else UNSORTED_PART


def overflow_part(base: str, index: int) -> str:
    """The part a full part's files go on in (`index` 0: the part itself)."""
    return base if index == 0 else f"{base}-{index}"


def overflow_chain(base: str, summary: Mapping[str, object]) -> list[str]:
    """`base` and its overflow parts the summary names, in order."""
    overflows = sorted(int(index) for part, _, index in (name.partition("-") for name in summary)
                       if part == base and index.isdigit())
    return [base, *(overflow_part(base, index) for index in overflows)]


def summary_of(files: StoredFiles) -> tuple[int, int | None]:
    """A part's bytes and its earliest expiry (None: no file in it expires)."""
    expiries = [expires_at for _, expires_at, _ in files.root.values() if expires_at is not None]
    return sum(size for size, _, _ in files.root.values()), min(expiries, default=None)


def stored_records(records: Iterable[FileRecord]) -> dict[str, StoredFiles | StoredBytes]:
    """The parts and summaries that a read model of these file records holds (what the writer keeps, made at once:
    replay and the first index)."""
    parts: defaultdict[tuple[str, str], dict[str, tuple[int, int | None, str]]] = defaultdict(dict)
    for record in records:
        if not record.deleted:
            parts[record.owner, part_of(record.sha256)][record.file.id] = _entry(record)
    made: dict[str, StoredFiles | StoredBytes] = {}
    summaries: defaultdict[str, dict[str, tuple[int, int | None]]] = defaultdict(dict)
    for (owner, base), files in parts.items():
        for index, split in enumerate(_split(dict(sorted(files.items())))):
            part = overflow_part(base, index)
            stored = made[owner_stored_part_key(owner, part)] = StoredFiles(split)
            summaries[owner][part] = summary_of(stored)
    made.update((owner_stored_key(owner), StoredBytes(dict(sorted(parts.items())))) for owner, parts in
                summaries.items())
    return made


def _split(files: dict[str, tuple[int, int | None, str]]) -> list[dict[str, tuple[int, int | None, str]]]:
    """The files of one part in order, as the writer fills it and its overflow parts (each within `MAX_PART_BYTES`)."""
    splits: list[dict[str, tuple[int, int | None, str]]] = [{}]
    size = 2  # "{}", then each entry with its comma: a running count, not the whole part serialised per file
    for file_id, entry in files.items():
        grows = len(StoredFiles({file_id: entry}).model_dump_json()) - 1
        if splits[-1] and size + grows > MAX_PART_BYTES:
            splits.append({})
            size = 2
        splits[-1][file_id] = entry
        size += grows
    return splits


def with_entry(entries: Mapping[str, Value], key: str, value: Value | None) -> dict[str, Value]:
    """`entries` with `key` set to `value` (None: left out), in key order."""
    changed = {name: held for name, held in entries.items() if name != key}
    if value is not None:
        changed[key] = value
    return dict(sorted(changed.items()))


def _entry(record: FileRecord) -> tuple[int, int | None, str]:
    return record.file.bytes, record.file.expires_at, record.sha256


async def stored_bytes_counting(kv: Bucket, owner: str, parts: Collection[str], now: float
                                ) -> tuple[int, dict[str, frozenset[str]]] | None:
    """The bytes of the owner's files that are neither deleted nor expired at `now`, and the files counted in it of
    each of `parts`: those parts (and any with an expired file) are read after the summary and counted from
    themselves, so a file of one is in the total exactly when it is in its set (the summary, written after a part,
    may not hold a change the part already shows). None: no summary (the owner has no files, or the ledger has not
    written the stored bytes of a read model made before they were kept)."""
    raw = await read_value(kv, owner_stored_key(owner))
    if raw is None:
        return None
    summary_record = decoded(StoredBytes, raw, owner_stored_key(owner))
    if summary_record is None:
        return None
    summary = summary_record.root
    chains = {part: overflow_chain(part, summary) for part in parts}  # a part's files may go on in overflow parts
    read = sorted({part for chain in chains.values() for part in chain}
                  | {part for part, (_, earliest) in summary.items()
                     if earliest is not None and earliest <= now})  # expired files are not counted
    files = dict(zip(read, await asyncio.gather(*(stored_part(kv, owner, part) for part in read)), strict=True))
    counted = {part: frozenset(file_id for file_id, (_, expires_at, _) in files[part].root.items()
                               if expires_at is None or expires_at > now) for part in read}
    total = sum(size for part, (size, _) in summary.items() if part not in files)
    total += sum(files[part].root[file_id][0] for part in read for file_id in counted[part])
    return total, {part: frozenset().union(*(counted[held] for held in chains[part])) for part in parts}


async def stored_with_overflow(kv: Bucket, owner: str, part: str) -> list[StoredFiles]:
    """The part and, once it is (nearly) full, the overflow parts its owner's summary names."""
    raw = await read_value(kv, owner_stored_part_key(owner, part))
    files = decoded(StoredFiles, raw, owner_stored_part_key(owner, part)) or StoredFiles({})
    if raw is None or len(raw) < MAX_PART_BYTES - NEARLY_FULL_BYTES:
        return [files]
    summary_raw = await read_value(kv, owner_stored_key(owner))
    summary = (decoded(StoredBytes, summary_raw, owner_stored_key(owner)) or StoredBytes({})).root
    overflows = overflow_chain(part, summary)[1:]
    return [files, *await asyncio.gather(*(stored_part(kv, owner, each) for each in overflows))]


async def stored_part(kv: Bucket, owner: str, part: str) -> StoredFiles:
    raw = await read_value(kv, owner_stored_part_key(owner, part))
    return decoded(StoredFiles, raw, owner_stored_part_key(owner, part)) or StoredFiles({})


class StoredBytesWriter:
    """The writer's side: a file record's change entered in its owner's part and summary (one owner at a time). The
    writer keeps what it last read or wrote of each (the read model has one writer): a change costs its writes."""

    def __init__(self, kv: Bucket) -> None:
        self.kv = kv
        self._locks = KeyedLocks()
        self._held: OrderedDict[str, StoredFiles | StoredBytes] = OrderedDict()
        """Parts and summaries as last read or written, the least recently used first."""

    async def _current(self, key: str, model: type[Stored]) -> Stored:
        held = self._held.get(key)
        if not isinstance(held, model):
            raw = await read_value(self.kv, key)
            held = decoded(model, raw, key) or model({})
        self._keep(key, held)
        return held

    async def _put(self, key: str, record: StoredFiles | StoredBytes) -> None:
        self._held.pop(key, None)  # a write that fails leaves nothing held: the next change reads the key again
        await (self.kv.put(key, record.model_dump_json().encode()) if record.root else self.kv.delete(key))
        self._keep(key, record)

    def _keep(self, key: str, record: StoredFiles | StoredBytes) -> None:
        self._held[key] = record
        self._held.move_to_end(key)
        while len(self._held) > MAX_HELD:
            self._held.popitem(last=False)

    async def enter(self, record: FileRecord) -> None:
        """Enter the file (or, deleted, remove it) in its owner's stored bytes; nothing is written when they hold it
        as it is already. A part past `MAX_PART_BYTES` goes on in overflow parts of its own (`ab-1`, `ab-2`, ...),
        each in the summary: a file is always counted (a tenant picks its files' digests, so it can fill a part)."""
        owner, base = record.owner, part_of(record.sha256)
        async with self._locks.hold(owner):
            entry = None if record.deleted else _entry(record)
            chain = overflow_chain(base, (await self._current(owner_stored_key(owner), StoredBytes)).root)
            for part in chain:  # the part holding the file, if one does
                files = await self._current(owner_stored_part_key(owner, part), StoredFiles)
                if record.file.id in files.root:
                    break
            else:
                part, files = base, await self._current(owner_stored_part_key(owner, base), StoredFiles)
                if entry is None:
                    return await self._summarise(owner, part, files)  # a delete again: nothing holds it
                fresh = overflow_part(base, int(chain[-1].partition("-")[2] or 0) + 1)
                for part in [*chain, fresh]:  # the first part with room takes it (a new one has room)
                    files = await self._current(owner_stored_part_key(owner, part), StoredFiles)
                    if len(StoredFiles(with_entry(files.root, record.file.id, entry)).model_dump_json()) \
                            <= MAX_PART_BYTES:
                        break
            if files.root.get(record.file.id) == entry:
                return await self._summarise(owner, part, files)  # a put again after a failure between the two
            files = StoredFiles(with_entry(files.root, record.file.id, entry))
            await self._put(owner_stored_part_key(owner, part), files)
            await self._summarise(owner, part, files)

    async def _summarise(self, owner: str, part: str, files: StoredFiles) -> None:
        parts = (await self._current(owner_stored_key(owner), StoredBytes)).root
        summary = summary_of(files) if files.root else None
        if parts.get(part) != summary:
            await self._put(owner_stored_key(owner), StoredBytes(with_entry(parts, part, summary)))

    async def index(self, records: Iterable[FileRecord]) -> int:
        """Write every owner's stored bytes from their file records (once, for a read model made before they were
        kept); how many owners have files."""
        made = stored_records(records)
        for key, record in made.items():
            await self._put(key, record)
        return sum(isinstance(record, StoredBytes) for record in made.values())
