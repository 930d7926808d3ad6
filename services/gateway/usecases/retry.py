"""A retry: a new batch of the lines that failed in an ended one (`metadata.retry_of` names it). The failed lines'
inputs are streamed into a new file and the batch created as `POST /v1/batches` would. By default lines that failed
at run time or never ran; a refused line only when `codes` names its code. Asked again, the same batch (derived id)."""

import contextlib
import secrets
from dataclasses import dataclass, field
from typing import Annotated, Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, Strict

from contracts.api.batch_request import MAX_METADATA_PAIRS, BatchCreateRequest
from contracts.api.request_line import MAX_LINE_BYTES
from contracts.ids import derived_id
from contracts.lifecycle import TERMINAL
from contracts.readmodel import ApiKeyRecord, BatchRecord, FileRecord
from contracts.subjects import input_object_key
from services.gateway.adapters.upload import Tally
from services.gateway.context import Deps
from services.gateway.usecases.batches import Created, create_from
from services.gateway.usecases.files import NewFile, state_file, stated_file
from services.gateway.usecases.refusals import ApiError, parse_fields
from services.runtime.storage.objectstore import ObjectNotFound

RETRY_OF = "retry_of"
"""The metadata key that links a retry to the batch it retries."""


class RetryRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    codes: list[str] | None = Field(default=None, max_length=64)
    """Only lines that failed with one of these codes; omitted: every line that failed at run time or never ran."""
    completion_window: str | None = None
    """Omitted: the original batch's."""
    metadata: dict[str, str] | None = None
    """Added to the original's metadata (with `retry_of`)."""
    allow_partial: Annotated[bool, Strict()] = False


@dataclass
class FailedLines:
    """What the error file says failed: input lines by number (refused by validation) and by custom_id."""

    numbers: set[int] = field(default_factory=set)
    custom_ids: set[str] = field(default_factory=set)

    def selects(self, number: int, custom_id: object) -> bool:
        if number in self.numbers:
            return True
        if isinstance(custom_id, str) and custom_id in self.custom_ids:
            self.custom_ids.discard(custom_id)  # the first input line with it (a custom_id runs once)
            return True
        return False


def failure_code(row: dict[str, Any]) -> str | None:
    """The code a row of an error file failed with (refused, or ran and failed), if it names one."""
    error = row.get("error")
    if isinstance(error, dict) and isinstance(error.get("code"), str):
        return str(error["code"])
    response = row.get("response")
    body = response.get("body") if isinstance(response, dict) else None
    nested = body.get("error") if isinstance(body, dict) else None
    return str(nested["code"]) if isinstance(nested, dict) and isinstance(nested.get("code"), str) else None


async def failed_lines(d: Deps, error_object_key: str, codes: set[str] | None) -> FailedLines:
    found = FailedLines()
    async with contextlib.aclosing(d.store.iter_lines(error_object_key)) as lines:
        async for raw in lines:
            if not raw.strip():
                continue
            row = orjson.loads(raw)
            code = failure_code(row)
            refused = isinstance(row.get("line"), int)
            if (codes is not None and code not in codes) or (codes is None and refused):
                continue
            if refused:
                found.numbers.add(int(row["line"]))
            elif isinstance(row.get("custom_id"), str):
                found.custom_ids.add(row["custom_id"])
    return found


async def retry(d: Deps, caller: ApiKeyRecord, key_digest: str, record: BatchRecord, body: RetryRequest) -> Created:
    """Create the retry of the caller's ended batch (409 while it runs, when nothing failed or its input is gone)."""
    batch = record.batch
    if batch.status not in TERMINAL:
        raise ApiError(409, f"Batch {batch.id} is {batch.status}; retry it once it has ended.", "conflict_error",
                       "batch_not_ended")
    error_file = await d.read_model.get_file(batch.error_file_id) if batch.error_file_id else None
    input_file = await d.read_model.get_file(batch.input_file_id)
    if error_file is None or error_file.deleted:
        raise _no_error_file(batch.id)
    if input_file is None or input_file.deleted:
        raise _input_deleted(batch.id, batch.input_file_id)
    codes = sorted(set(body.codes)) if body.codes is not None else None
    key = f"retry:{batch.id}:{','.join(codes) if codes is not None else '*'}"
    file_id = derived_id("file-", caller.owner, key)
    if await d.read_model.get_file(file_id) is None:
        await _copy_failed_lines(d, caller, batch.id, (error_file, input_file), codes, file_id)
    metadata = {**(batch.metadata or {}), **(body.metadata or {}), RETRY_OF: batch.id}
    if len(metadata) > MAX_METADATA_PAIRS:
        raise ApiError(400, f"The retry's metadata would have {len(metadata)} pairs (with {RETRY_OF}); the limit is "
                       f"{MAX_METADATA_PAIRS}.", code="invalid_metadata", param="metadata")
    create = parse_fields(BatchCreateRequest, {
        "input_file_id": file_id, "endpoint": batch.endpoint,
        "completion_window": body.completion_window or batch.completion_window, "metadata": metadata,
        "allow_partial": body.allow_partial, "placement": batch.placement or "approved_providers"})
    try:
        return await create_from(d, caller, key_digest, create, key)
    except ApiError as refused:
        if refused.body.code != "idempotency_conflict":
            raise
        # The retry's own derived key, which the client never sent: say what differs in the client's own terms.
        earlier = derived_id("batch_", caller.owner, key)
        raise ApiError(409, f"Batch {batch.id} was already retried as batch {earlier}, with another "
                       "completion_window, metadata or allow_partial; ask again as it was asked then, or retry "
                       f"{earlier} once it has ended.", "conflict_error", "already_retried") from None


async def _copy_failed_lines(d: Deps, caller: ApiKeyRecord, batch_id: str, files: tuple[FileRecord, FileRecord],
                             codes: list[str] | None, file_id: str) -> None:
    """The retry's input: the batch's failed lines (of `codes`; `files`: its error and input files) copied into the
    file `file_id`, readable once it is back."""
    error_file, input_file = files
    try:  # deleted since the read above (a DELETE of the file at the same time): as if deleted before
        wanted = await failed_lines(d, error_file.object_key, set(codes) if codes is not None else None)
    except ObjectNotFound:
        raise _no_error_file(batch_id) from None
    try:
        lines, sequence = await copy_lines(d, caller, input_file.object_key, file_id, wanted, input_file.model)
    except ObjectNotFound:  # the input was deleted since the read above, before its copy began
        raise _input_deleted(batch_id, input_file.file.id) from None
    except ApiError:
        # The same retry asked at once elsewhere stated the copy first (its bytes then counted against the quota
        # this request's copy was refused by): that copy is this retry's too.
        if (first := await stated_file(d, file_id)) is None:
            raise
        lines, sequence = first[1].line_count or 1, first[0]
    if lines == 0:
        raise ApiError(409, f"No line of batch {batch_id} failed with {', '.join(codes or []) or 'a run-time code'}"
                       "; nothing to retry.", "conflict_error", "nothing_to_retry")
    await d.folds.read_back(lambda: d.read_model.get_file(file_id), sequence, d.settings.read_your_writes_s)


def _no_error_file(batch_id: str) -> ApiError:
    return ApiError(409, f"Batch {batch_id} has no error file: no line failed.", "conflict_error", "nothing_to_retry")


def _input_deleted(batch_id: str, input_file_id: str) -> ApiError:
    return ApiError(409, f"The input file {input_file_id} of batch {batch_id} was deleted; upload the lines again to "
                    "run them.", "conflict_error", "input_file_deleted")


async def copy_lines(d: Deps, caller: ApiKeyRecord, source_key: str, file_id: str, wanted: FailedLines,
                     model: str | None) -> tuple[int, int]:
    """Copy the wanted input lines into a new file and state it: lines copied, and its `stored` fact's sequence. The
    copy is written under an object key of this request's own (`<file id>.<random>`): the same retry asked at once
    elsewhere copies beside it, never over it, and whichever is not stated is removed by its own request alone."""
    object_key = input_object_key(f"{file_id}.{secrets.token_hex(8)}")
    writer = d.store.writer(object_key, "application/jsonl", own_key=True)
    tally, number = Tally(), 0
    try:
        async with contextlib.aclosing(d.store.iter_lines(source_key)) as lines:
            async for raw in lines:
                number += 1
                if not raw.strip():
                    continue
                try:  # a line too long to have run is not parsed (on the event loop): it is chosen by number alone
                    custom_id = orjson.loads(raw).get("custom_id") if len(raw) <= MAX_LINE_BYTES else None
                except (orjson.JSONDecodeError, AttributeError):
                    custom_id = None
                if wanted.selects(number, custom_id):
                    data = raw + b"\n"
                    tally.feed(data)
                    await writer.write(data)
        await writer.finish()
    except BaseException:
        await writer.abort()
        raise
    if tally.newlines == 0:
        await d.store.remove(object_key)
        return 0, 0
    # A retry's copy is stored like an upload.
    _, sequence = await state_file(d, caller, NewFile(file_id, object_key, tally.stored(), f"{file_id}.jsonl", "batch",
                                                      None, model), d.settings.batch_file_ttl_s, once=True)
    return tally.newlines, sequence
