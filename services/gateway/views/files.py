"""`/v1/files`: upload (deduplicated, within the owner's quota, with an expiry), list, retrieve, download, delete."""

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Awaitable
from typing import TypeVar, get_args

import orjson
from aiohttp import BodyPartReader, MultipartReader, web
from aiohttp.http_exceptions import HttpProcessingError
from minio.error import S3Error

from contracts.api.file import FileDeleted, FileObject, FilePurpose
from contracts.events.file import FileDeleted as FileDeletedEvent
from contracts.events.file import FileStored, FileUsed
from contracts.ids import new_file_id
from contracts.lifecycle import TERMINAL
from contracts.readmodel import FileRecord
from contracts.subjects import file_fact, input_object_key
from services.gateway.admission import ADMISSION, Holdings
from services.gateway.auth import principal
from services.gateway.body_pace import BodyPace, client_stalled
from services.gateway.context import Deps, deps
from services.gateway.disposition import content_disposition
from services.gateway.errors import ApiError, bad_request, not_found
from services.gateway.limits import charge_control_call
from services.gateway.transfer_slots import DOWNLOAD_SLOTS, UPLOAD_SLOTS
from services.gateway.upload import StoredUpload, store_unavailable, stream_part_to_store
from services.gateway.views.paging import MAX_FILES_LIMIT, page_after, parse_limit
from services.runtime.bus import Fence, FenceMoved
from services.runtime.facts import last_fact
from services.runtime.objectstore import TRANSIENT, ObjectNotFound

log = logging.getLogger(__name__)
Result = TypeVar("Result")
UPLOADABLE_PURPOSES = ("batch",)
ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,128}")
"""Every id we hand out; anything else (`../x`, `a%2Fb`, spaces) names nothing."""
MIN_EXPIRES_AFTER_S, MAX_EXPIRES_AFTER_S = 3600, 30 * 24 * 3600
FORM_FIELD_BYTES = 1024
DEDUPLICATED_FROM = "X-Sheshnag-Deduplicated-From"
STORED_BYTES = "stored_bytes"
CONTENT_SHA256 = "X-Sheshnag-Content-SHA256"


def is_valid_id(ident: str) -> bool:
    return ID_PATTERN.fullmatch(ident) is not None


def is_expired(record: FileRecord, now: float | None = None) -> bool:
    expires_at = record.file.expires_at
    return expires_at is not None and expires_at <= (time.time() if now is None else now)


async def owned_file(request: web.Request, file_id: str) -> FileRecord:
    d, owner = deps(request), principal(request).owner
    record = await d.read_model.get_file(file_id) if is_valid_id(file_id) else None
    if record is None and d.own_writes.awaits(owner, "file", file_id):  # uploaded here a moment ago
        await d.own_writes.settle(d.read_model, owner, ("file",), d.settings.own_writes_wait_s)
        record = await d.read_model.get_file(file_id)
    if record is None or record.deleted or record.owner != principal(request).owner or is_expired(record):
        raise not_found("file", file_id)
    return record


async def indexed_files(d: Deps, owner: str) -> list[FileRecord]:
    """The owner's index of files (not deleted; expired ones included), read once for all the requests in flight
    that ask for it together (shared_reads.py): the records are shared, so callers never change them."""
    return await d.shared_reads.read(("files", owner), lambda: d.read_model.owner_files(owner))


async def owner_files(d: Deps, owner: str) -> list[FileRecord]:
    """The owner's files that still exist (not deleted, not expired), read from the owner's index alone."""
    now = time.time()
    return [r for r in await indexed_files(d, owner) if not r.deleted and not is_expired(r, now)]


def expires_after_seconds(anchor: str | None, seconds: str | None) -> int | None:
    """The SDK's `expires_after={"anchor": "created_at", "seconds": N}`, sent as two form fields."""
    if anchor is None and seconds is None:
        return None
    if anchor != "created_at" or seconds is None or not seconds.isdigit() \
            or not MIN_EXPIRES_AFTER_S <= int(seconds) <= MAX_EXPIRES_AFTER_S:
        raise bad_request(f"expires_after must be {{'anchor': 'created_at', 'seconds': N}} with N between "
                          f"{MIN_EXPIRES_AFTER_S} and {MAX_EXPIRES_AFTER_S}.", "invalid_expires_after",
                          "expires_after")
    return int(seconds)


async def form_field(part: BodyPartReader) -> str:
    value = await part.read_chunk(FORM_FIELD_BYTES + 1)
    if len(value) > FORM_FIELD_BYTES or await part.read_chunk(1):
        raise bad_request(f"Form field '{part.name}' is longer than {FORM_FIELD_BYTES} bytes.",
                          "invalid_form_field", part.name)
    try:
        return value.decode().strip()
    except UnicodeDecodeError:
        raise bad_request(f"Form field '{part.name}' is not UTF-8.", "invalid_form_field", part.name) from None


def expires_after_json(raw: str) -> tuple[str | None, str | None]:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise bad_request("expires_after must be a JSON object.", "invalid_expires_after", "expires_after")
    return str(value.get("anchor")), str(value.get("seconds"))


class _Upload:
    """The parts of one multipart upload, read in one pass; the file part goes straight to the store."""

    def __init__(self) -> None:
        self.fields: dict[str, str] = {}
        self.stored: StoredUpload | None = None
        self.filename = "upload.jsonl"

    async def read(self, reader: MultipartReader, d: Deps, object_key: str, pace: BodyPace) -> None:
        while (part := await pace.read(reader.next())) is not None:
            if not isinstance(part, BodyPartReader):
                raise bad_request("Nested multipart bodies are not accepted.", "invalid_multipart")
            if part.name == "file" and self.stored is None:
                self.filename = part.filename or self.filename
                self.stored = await stream_part_to_store(part, d.store, object_key, d.settings.max_upload_bytes,
                                                         pace, d.settings.object_store_timeout_s)
            elif part.name in ("purpose", "expires_after", "expires_after[anchor]", "expires_after[seconds]"):
                self.fields[part.name] = await pace.read(form_field(part))

    def expires_after_s(self) -> int | None:
        if "expires_after" in self.fields:
            return expires_after_seconds(*expires_after_json(self.fields["expires_after"]))
        return expires_after_seconds(self.fields.get("expires_after[anchor]"),
                                     self.fields.get("expires_after[seconds]"))


async def _within(idle_s: float, step: Awaitable[Result]) -> Result:
    """A read of the request body that the client must feed within `idle_s`, else 408."""
    try:
        async with asyncio.timeout(idle_s):
            return await step
    except TimeoutError:
        raise client_stalled(idle_s) from None


async def discard_object(d: Deps, object_key: str) -> None:
    """Remove what a refused upload stored; a store that is down keeps an object no fact names (harmless)."""
    try:
        await d.store.remove(object_key)
    except (S3Error, *TRANSIENT) as error:
        log.warning("could not remove refused upload %s: %r", object_key, error)


async def _read_upload(request: web.Request, d: Deps, object_key: str) -> _Upload:
    upload = _Upload()
    settings = d.settings
    try:
        async with request.app[UPLOAD_SLOTS].slot(principal(request).owner):
            # The pace starts with the slot: time spent waiting for one is never the client's.
            pace = BodyPace(lambda: request.content.total_bytes, settings.client_idle_timeout_s,
                            settings.upload_min_bytes_per_s, settings.upload_min_rate_window_s)
            await upload.read(await request.multipart(), d, object_key, pace)
    except (ValueError, AssertionError, LookupError, HttpProcessingError) as broken:
        # aiohttp's multipart parser says "malformed" with these; nothing of the upload is kept.
        if upload.stored is not None:
            await discard_object(d, object_key)
        raise bad_request(f"The multipart body could not be read ({type(broken).__name__}).",
                          "invalid_multipart") from None
    except BaseException:
        if upload.stored is not None:
            await asyncio.shield(discard_object(d, object_key))
        raise
    return upload


UPLOAD_MODEL_HEADER = "x-litellm-model"
MAX_MODEL_NAME = 256


def upload_model(request: web.Request) -> str | None:
    """The model an upload names for its lines that name none (LiteLLM's header, or `?model=`), if any."""
    name = request.headers.get(UPLOAD_MODEL_HEADER) or request.query.get("model")
    if name is None:
        return None
    if not name.strip() or len(name) > MAX_MODEL_NAME:
        raise bad_request(f"The model named at upload must be a model id of at most {MAX_MODEL_NAME} characters "
                          "(see GET /v1/models).", "invalid_model", UPLOAD_MODEL_HEADER)
    return name.strip()


async def admit_bytes(request: web.Request, owner: str, file_id: str, size: int) -> None:
    """Take `size` bytes of the owner's storage quota for `file_id` (atomically across gateways), else 400
    `storage_quota_exceeded`. The caller publishes the file next; anything it then fails to publish counts until
    the admission's grace ends."""
    d = deps(request)

    async def held(listed: frozenset[str]) -> Holdings:
        indexed = await indexed_files(d, owner)  # a deleted file leaves the index: look listed ones up
        # A listed file the index did not show may have been folded since the index was read: it is looked up by
        # id, and counted if it still holds its bytes (else known, and gone).
        found = [record for i in listed - {r.file.id for r in indexed}
                 if (record := await d.read_model.get_file(i)) is not None]
        now = time.time()
        return Holdings({r.file.id: r.file.bytes for r in [*indexed, *found]
                         if not r.deleted and not is_expired(r, now)},
                        frozenset({r.file.id for r in [*indexed, *found]}))

    quota = d.settings.storage_quota_bytes
    used = await request.app[ADMISSION].take(STORED_BYTES, owner, file_id, size, quota, held)
    if used is not None:
        raise bad_request(f"Storing {size} more bytes would exceed your storage quota of {quota} bytes ({used} in "
                          "use); delete files first.", "storage_quota_exceeded", "file")


async def create_file(request: web.Request) -> web.Response:
    if not request.content_type.startswith("multipart/"):
        raise bad_request("Upload a file as multipart/form-data with fields 'purpose' and 'file'.",
                          "invalid_content_type")
    model = upload_model(request)
    await charge_control_call(request)
    d = deps(request)
    owner = principal(request).owner
    file_id = new_file_id()
    object_key = input_object_key(file_id)
    upload = await _read_upload(request, d, object_key)
    stored = upload.stored
    if stored is None:
        raise bad_request("The 'file' field is missing.", "missing_file", "file")
    try:
        purpose = upload.fields.get("purpose")
        if purpose not in UPLOADABLE_PURPOSES:
            allowed = ", ".join(UPLOADABLE_PURPOSES)
            raise bad_request(f"purpose must be one of: {allowed} (got {purpose!r}).", "invalid_purpose", "purpose")
        ttl_s = upload.expires_after_s() or d.settings.batch_file_ttl_s
        # The same upload again (same bytes, name, purpose, expiry and model: a retry) is the first file; anything
        # that differs is a file object of its own, even with the same bytes.
        same = next((r for r in await owner_files(d, owner) if r.sha256 == stored.sha256
                     and r.file.purpose == purpose and r.file.filename == upload.filename and r.model == model
                     and (r.file.expires_at or 0) - r.file.created_at == ttl_s), None)
        if same is not None:
            await discard_object(d, object_key)
            return web.json_response(same.file.model_dump(mode="json"), headers={DEDUPLICATED_FROM: same.file.id})
        await admit_bytes(request, owner, file_id, stored.bytes)
    except ApiError:
        await discard_object(d, object_key)
        raise
    now = int(time.time())
    event = FileStored(aggregate_id=file_id, owner_key_id=principal(request).key_id, filename=upload.filename,
                       purpose="batch", bytes=stored.bytes, sha256=stored.sha256, object_key=object_key,
                       created_at=now, line_count=stored.line_count, expires_at=now + ttl_s, model=model,
                       demand=stored.demand)
    await d.bus.publish(event)
    record = await d.read_model.wait_for(lambda: d.read_model.get_file(file_id), lambda r: True,
                                         d.settings.read_your_writes_s)
    if record is None:
        d.own_writes.note(owner, "file", file_id)  # the owner's next list waits for it
    file = record.file if record else FileObject(id=file_id, bytes=event.bytes, created_at=event.created_at,
                                                 filename=upload.filename, purpose="batch",
                                                 expires_at=event.expires_at)
    return web.json_response(file.model_dump(mode="json"))


async def list_files(request: web.Request) -> web.Response:
    purpose = request.query.get("purpose")
    if purpose is not None and purpose not in get_args(FilePurpose):
        raise bad_request(f"Unknown purpose {purpose!r}.", "invalid_purpose", "purpose")
    order = request.query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad_request(f"order must be 'asc' or 'desc' (got {order!r}).", "invalid_order", "order")
    d, owner = deps(request), principal(request).owner
    await d.own_writes.settle(d.read_model, owner, ("file", "file_deleted"), d.settings.own_writes_wait_s)
    records = await owner_files(d, owner)
    mine = [r.file for r in records if purpose is None or r.file.purpose == purpose]
    mine.sort(key=lambda f: (f.created_at, f.id), reverse=order == "desc")
    limit = parse_limit(request, MAX_FILES_LIMIT, MAX_FILES_LIMIT)
    page = page_after(mine, [f.id for f in mine], request.query.get("after"), limit)
    return web.json_response(page.model_dump(mode="json"))


async def retrieve_file(request: web.Request) -> web.Response:
    record = await owned_file(request, request.match_info["file_id"])
    return web.json_response(record.file.model_dump(mode="json"))


async def file_content(request: web.Request) -> web.StreamResponse:
    d = deps(request)
    record = await owned_file(request, request.match_info["file_id"])
    async with request.app[DOWNLOAD_SLOTS].slot(principal(request).owner):
        try:
            chunks = d.store.iter_chunks(record.object_key)
            first = await anext(chunks, b"")
        except ObjectNotFound:
            raise not_found("file", record.file.id) from None
        except (S3Error, *TRANSIENT) as error:
            raise store_unavailable(error) from None
        async with contextlib.aclosing(chunks):
            response = web.StreamResponse(headers={"Content-Type": "application/octet-stream",
                                                   "Content-Length": str(record.file.bytes),
                                                   "Content-Disposition": content_disposition(record.file.filename),
                                                   CONTENT_SHA256: record.sha256})
            await response.prepare(request)
            idle_s = d.settings.client_idle_timeout_s
            try:
                await _within(idle_s, response.write(first))
                async for chunk in chunks:
                    await _within(idle_s, response.write(chunk))
            except (ApiError, S3Error, *TRANSIENT) as broken:
                # The status is sent already: cut the connection so the client sees a short body, not a whole file.
                log.info("download of %s ended early: %r", record.file.id, broken)
                if request.transport is not None:
                    request.transport.close()
                return response
            await response.write_eof()
    return response


CLAIM_GRACE_S = 300
"""A `used` fact whose batch never appeared in the read model (its create died in between) stops holding the
file this long after it was published."""


async def live_batch_using(d: Deps, owner: str, file_id: str) -> str | None:
    """The id of a batch of `owner` that reads `file_id` and has not ended, if there is one."""
    for record in await d.read_model.owner_live_batches(owner):
        if record.batch.input_file_id == file_id:
            return record.batch.id
    return None


async def last_claim(d: Deps, file_id: str) -> tuple[int, str | None]:
    """The sequence of the file's last `used` fact (0: none), and its batch if that may still be live: a create
    that the read model has not folded yet counts as live."""
    found = await last_fact(d.bus, file_fact(file_id, "used"))
    if found is None:
        return 0, None
    sequence, used = found
    if not isinstance(used, FileUsed):
        return sequence, None
    record = await d.read_model.get_batch(used.batch_id)
    if record is None:
        fresh = time.time() - used.occurred_at / 1000 < CLAIM_GRACE_S
        return sequence, used.batch_id if fresh else None
    return sequence, None if record.batch.status in TERMINAL else used.batch_id


async def delete_stored_file(d: Deps, record: FileRecord, fence: Fence | None = None) -> None:
    """Publish the deletion (deduplicated by its fact id, so a repeat is harmless), then free the bytes.
    With a `fence`, only while it holds (else `FenceMoved`, and nothing is deleted)."""
    file_id = record.file.id
    await d.bus.publish(FileDeletedEvent(aggregate_id=file_id, owner_key_id=record.owner_key_id), fence=fence)
    folded = await d.read_model.wait_for(lambda: d.read_model.get_file(file_id), lambda r: r.deleted,
                                         d.settings.read_your_writes_s)
    if folded is None or not folded.deleted:
        d.own_writes.note(record.owner, "file_deleted", file_id)  # the owner's next list waits for it
    await d.store.remove(record.object_key)


async def delete_unless_in_use(d: Deps, record: FileRecord) -> str | None:
    """Delete the file unless a batch that has not ended reads it: then that batch's id, and nothing is deleted.
    A create racing this delete wins or loses whole: the deletion is fenced on the file's last `used` fact."""
    file_id = record.file.id
    claimed_at, claimed_by = await last_claim(d, file_id)
    batch_id = claimed_by or await live_batch_using(d, record.owner, file_id)
    if batch_id is not None:
        return batch_id
    try:
        await delete_stored_file(d, record, Fence(file_fact(file_id, "used"), claimed_at))
    except FenceMoved:
        return (await last_claim(d, file_id))[1] or "being created"
    return None


async def delete_file(request: web.Request) -> web.Response:
    d = deps(request)
    file_id = request.match_info["file_id"]
    record = await owned_file(request, file_id)
    await charge_control_call(request)
    batch_id = await delete_unless_in_use(d, record)
    if batch_id is not None:
        raise ApiError(409, f"File {file_id} is the input of batch {batch_id}, which has not ended; cancel it or "
                       "wait for it to end before deleting the file.", "invalid_request_error", "file_in_use",
                       "file_id")
    return web.json_response(FileDeleted(id=file_id, deleted=True).model_dump())
