"""The error file of a batch that failed validation, written to the object store as it is built (every input
line once: refused lines with their errors, the others `batch_failed_validation`), and the fact that files it
under the batch's owner, as executors file their output files."""

import asyncio
import hashlib
import time

from contracts.api.file import RESULT_FILE_EXPIRES_AFTER_S
from contracts.api.rejected_line import RejectedLine
from contracts.events.batch import BatchCreated
from contracts.events.file import FileStored
from contracts.ids import error_file_id
from contracts.subjects import input_object_key
from services.runtime.objectstore import ObjectStore
from services.validator.domain import FileValidation
from services.validator.refusals import not_run_message, not_run_output

WINDOW_LINES = 256
"""Input lines turned into error lines together, off the event loop."""


async def write_error_file(store: ObjectStore, created: BatchCreated, validation: FileValidation,
                           refused: dict[int, RejectedLine]) -> FileStored | None:
    """Write the error file of a failed batch and return its `file.stored` fact; None for a file of no lines.
    Deterministic in the input: written again, it has the same id and bytes."""
    if validation.total_lines == 0:
        return None
    batch_id = created.aggregate_id
    file_id = error_file_id(batch_id)
    key = input_object_key(file_id)
    message = not_run_message(validation)
    digest, size, lines = hashlib.sha256(), 0, 0

    def encode(window: list[tuple[int, bytes]]) -> bytes:
        out = bytearray()
        for number, raw in window:
            rejected = refused.get(number)
            line = rejected.error_line(batch_id) if rejected is not None else not_run_output(
                batch_id, number, raw, message, checked=not validation.unchecked(number))
            out += line.model_dump_json().encode() + b"\n"
        return bytes(out)

    async def send(window: list[tuple[int, bytes]]) -> None:
        nonlocal size, lines
        data = await asyncio.to_thread(encode, window)
        digest.update(data)
        size, lines = size + len(data), lines + len(window)
        await upload.write(data)

    upload = store.writer(key, "application/jsonl")
    try:
        window: list[tuple[int, bytes]] = []
        number = 0
        async for raw in store.iter_lines(created.input_object_key):
            number += 1
            if raw.strip():
                window.append((number, raw))
            if len(window) >= WINDOW_LINES:
                await send(window)
                window = []
        await send(window)
        await upload.finish()
    except BaseException:
        await upload.abort()
        raise
    created_at = int(time.time())
    return FileStored(aggregate_id=file_id, causation_id=created.event_id,
                      owner_key_id=created.owner_key_id, filename=f"{batch_id}_error.jsonl", purpose="batch_output",
                      bytes=size, sha256=digest.hexdigest(), object_key=key, created_at=created_at,
                      line_count=lines, batch_id=batch_id,
                      expires_at=created_at + (created.output_expires_after_s or RESULT_FILE_EXPIRES_AFTER_S))
