"""Result chunks and assembled files in the object store."""

import asyncio
import hashlib
import time
from collections.abc import Callable

from contracts.api.file import RESULT_FILE_EXPIRES_AFTER_S
from contracts.api.rejected_line import RejectedLine
from contracts.events.file import FileStored
from contracts.subjects import input_object_key, rejections_key, result_chunk_key, results_prefix
from services.executor.adapters.objects import ObjectAccess
from services.executor.domain import (
    REFUSED_ATTEMPT,
    Chunk,
    CommittedLine,
    decode_chunk,
    encode_chunk,
    refused_line,
)


class ResultStore:
    def __init__(self, store: ObjectAccess) -> None:
        self.store = store

    async def committed(self, batch_id: str, counts: Callable[[str], bool]) -> list[tuple[str, list[CommittedLine]]]:
        """Every result chunk of the batch that `counts` (a chunk counts once a fact announced it), plus the lines
        validation refused (allow_partial), as a chunk of attempt 0: they are settled before any attempt starts."""
        keys = [key for key in await self.store.list_keys(results_prefix(batch_id))
                if key.endswith(".jsonl") and counts(key)]
        blobs = await asyncio.gather(*(self.store.get_bytes(key) for key in keys))
        chunks = [(key, decode_chunk(blob)) for key, blob in zip(keys, blobs, strict=True)]
        if await self.store.list_keys(rejections_key(batch_id)):
            refused = (await self.store.get_bytes(rejections_key(batch_id))).splitlines()
            lines = [refused_line(batch_id, RejectedLine.model_validate_json(raw)) for raw in refused if raw.strip()]
            chunks.append((result_chunk_key(batch_id, REFUSED_ATTEMPT, 0), lines))
        return chunks

    async def put_chunk(self, batch_id: str, attempt: int, chunk: Chunk) -> str:
        key = result_chunk_key(batch_id, attempt, chunk.number)
        await self.store.put_bytes(key, encode_chunk(chunk.lines))
        return key

    async def put_file(self, batch_id: str, file_id: str, data: bytes, owner_key_id: str, filename: str,
                       line_count: int, expires_after_s: int | None = None) -> FileStored:
        """Write a result file and return the fact that announces it; it expires `expires_after_s` (default 30
        days) after it is written, as OpenAI's `output_expires_after` counts from the file's creation."""
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
