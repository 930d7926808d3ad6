"""The error file of a batch that failed validation, written to the object store as it is built (every input
line once: refused lines with their errors, the others `batch_failed_validation`), and the fact that files it
under the batch's owner, as executors file their output files."""

import asyncio
import hashlib
import time
from collections.abc import Generator

from contracts.api.file import RESULT_FILE_EXPIRES_AFTER_S
from contracts.api.rejected_line import RejectedLine
from contracts.events.batch import BatchCreated
from contracts.events.file import FileStored
from contracts.ids import error_file_id, result_file_name
from contracts.subjects import input_object_key
from services.runtime.storage.objectstore import ObjectStore
from services.validator.adapters.input_lines import lines_by_chunk
from services.validator.domain import FileValidation
from services.validator.refusals import NotRunLines, RefusedLines, not_run_message

BATCH_LINES = 8192
"""Error lines written together from memory, off the event loop."""


def error_lines(store: ObjectStore, created: BatchCreated, validation: FileValidation,
                refused: dict[int, RejectedLine]) -> Generator[tuple[bytes, int], None, None]:
    """The error file's lines, a batch at a time (blocking): (their bytes, how many). A checked unrefused line's
    custom_id is the one validation recorded, so the file is written from memory; only one with lines past the line
    limit (never checked) is read again, for their custom_ids."""
    batch_id = created.aggregate_id
    not_run, refused_lines = NotRunLines(batch_id, not_run_message(validation)), RefusedLines(batch_id)
    custom_ids = {line: custom_id for custom_id, line in validation.first_line_of.items()}
    blank = set(validation.blank_lines)
    numbers = [n for n in range(1, validation.lines_seen + 1) if n not in blank]
    if validation.limit_line is None and not set(numbers).difference(refused, custom_ids):
        for start in range(0, len(numbers), BATCH_LINES):
            batch = numbers[start:start + BATCH_LINES]
            yield b"".join(refused_lines.line(rejected) + b"\n" if (rejected := refused.get(number)) is not None
                           else not_run.line(number, custom_ids[number], checked=True) + b"\n"
                           for number in batch), len(batch)
        return
    number = 0
    for lines in lines_by_chunk(store, created.terms.input_object_key, validation.limits.max_line_bytes):
        out = bytearray()
        count = 0
        for raw in lines:
            number += 1
            if not raw.strip():
                continue
            count += 1
            rejected = refused.get(number)
            if rejected is not None:
                out += refused_lines.line(rejected)
            elif validation.unchecked(number) or number not in custom_ids:
                out += not_run.of_raw(number, raw, checked=not validation.unchecked(number))
            else:
                out += not_run.line(number, custom_ids[number], checked=True)
            out += b"\n"
        yield bytes(out), count


async def write_error_file(store: ObjectStore, created: BatchCreated, validation: FileValidation,
                           refused: dict[int, RejectedLine]) -> FileStored | None:
    """Write a failed batch's error file (deterministic in the input) and return its `file.stored`; None if empty."""
    if validation.total_lines == 0:
        return None
    batch_id = created.aggregate_id
    file_id = error_file_id(batch_id)
    key = input_object_key(file_id)
    digest, size, lines = hashlib.sha256(), 0, 0
    upload = store.writer(key, "application/jsonl")
    chunks = error_lines(store, created, validation, refused)
    try:
        while (chunk := await asyncio.to_thread(next, chunks, None)) is not None:
            data, count = chunk
            digest.update(data)
            size, lines = size + len(data), lines + count
            await upload.write(data)
        await upload.finish()
    except BaseException:
        await upload.abort()
        raise
    finally:
        await asyncio.to_thread(chunks.close)
    created_at = int(time.time())
    return FileStored(aggregate_id=file_id, causation_id=created.event_id,
                      owner_key_id=created.terms.owner_key_id, filename=result_file_name(batch_id, "error"),
                      purpose="batch_output", bytes=size, sha256=digest.hexdigest(), object_key=key,
                      created_at=created_at, line_count=lines, batch_id=batch_id,
                      expires_at=created_at + (created.terms.output_expires_after_s or RESULT_FILE_EXPIRES_AFTER_S))
