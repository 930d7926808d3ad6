"""Result chunks and assembled files in the object store: a batch's committed chunks, a unit's own, the lines
validation refused."""

import asyncio
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

from contracts.api.file import RESULT_FILE_EXPIRES_AFTER_S
from contracts.api.rejected_line import RejectedLine
from contracts.events.file import FileStored
from contracts.subjects import input_object_key, rejections_key, result_chunk_key, results_prefix
from services.executor.adapters.objects import ObjectAccess
from services.executor.chunk_lines import ResultLine, encode_chunk, read_chunk
from services.executor.domain import REFUSED_ATTEMPT, Chunk, CommittedLine, refused_line

REFUSED_BATCHES = 64
"""Batches whose refused lines are kept in memory (read once per batch, not once per unit)."""
LOOK = "look"
Rejections = str | None
"""A batch's refused lines: their object's key (from a run command), None (none), or `LOOK` (ask the store)."""


class ResultStore:
    def __init__(self, store: ObjectAccess) -> None:
        self.store = store
        self._refused: OrderedDict[str, asyncio.Future[list[CommittedLine]]] = OrderedDict()

    async def committed(self, batch_id: str, counts: Callable[[str], bool],
                        rejections: Rejections = LOOK) -> Sequence[tuple[str, Sequence[ResultLine]]]:
        """Every result chunk of the batch that `counts`, plus the lines validation refused as a chunk of attempt 0."""
        keys = [key for key in await self.store.list_keys(results_prefix(batch_id))
                if key.endswith(".jsonl") and counts(key)]
        chunks = await self.chunks(keys)
        refused = await self._read_refused(batch_id, rejections)  # read here, never through the cache of units'
        return [*chunks, *([(result_chunk_key(batch_id, REFUSED_ATTEMPT, 0), refused)] if refused else [])]

    async def chunks(self, keys: Iterable[str]) -> Sequence[tuple[str, Sequence[ResultLine]]]:
        keys = sorted(keys)
        blobs = await asyncio.gather(*(self.store.get_bytes(key) for key in keys))
        return [(key, read_chunk(blob)) for key, blob in zip(keys, blobs, strict=True)]

    async def attempt_chunk_keys(self, batch_id: str, attempt: int) -> list[str]:
        """The chunks `attempt` wrote, announced or not (a delivery may have died between the two)."""
        prefix = result_chunk_key(batch_id, attempt, 0).rsplit("/", 1)[0] + "/"
        return [key for key in await self.store.list_keys(prefix) if key.endswith(".jsonl")]

    async def refused(self, batch_id: str, keep: Callable[[int], bool],
                      rejections: Rejections = LOOK) -> list[tuple[str, list[CommittedLine]]]:
        """The lines validation refused that `keep` (by input line), as a chunk of attempt 0; read once per batch."""
        if rejections is None:
            return []
        read = self._refused.get(batch_id)
        if read is None or (read.done() and (read.cancelled() or read.exception() is not None)):
            # Concurrent first units of the batch share one read; a failed one is tried again by the next.
            read = self._refused[batch_id] = asyncio.ensure_future(self._read_refused(batch_id, rejections))
            while len(self._refused) > REFUSED_BATCHES:
                self._refused.popitem(last=False)
        self._refused.move_to_end(batch_id)
        lines = await asyncio.shield(read)
        kept = [line for line in lines if keep(line.line)]
        return [(result_chunk_key(batch_id, REFUSED_ATTEMPT, 0), kept)] if kept else []

    def forget(self, batch_id: str) -> None:
        self._refused.pop(batch_id, None)

    async def _read_refused(self, batch_id: str, rejections: Rejections) -> list[CommittedLine]:
        if rejections is None or (rejections == LOOK and not await self.store.list_keys(rejections_key(batch_id))):
            return []
        refused = (await self.store.get_bytes(rejections_key(batch_id))).splitlines()
        return [refused_line(batch_id, RejectedLine.model_validate_json(raw)) for raw in refused if raw.strip()]

    async def put_chunk(self, batch_id: str, attempt: int, chunk: Chunk) -> str:
        key = result_chunk_key(batch_id, attempt, chunk.number)
        await self.store.put_bytes(key, encode_chunk(chunk.lines))
        return key

    async def put_file(self, batch_id: str, file_id: str, data: bytes, owner_key_id: str, filename: str,
                       line_count: int, expires_after_s: int | None = None) -> FileStored:
        """Write a result file and return the fact that announces it, expiring `expires_after_s` after its creation."""
        key = input_object_key(file_id)
        await self.store.put_bytes(key, data)
        created_at = int(time.time())
        return FileStored(
            aggregate_id=file_id,
            owner_key_id=owner_key_id,
            filename=filename,
            purpose="batch_output",
            bytes=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
            object_key=key,
            created_at=created_at,
            line_count=line_count,
            expires_at=created_at + (expires_after_s or RESULT_FILE_EXPIRES_AFTER_S),
            batch_id=batch_id,
        )
