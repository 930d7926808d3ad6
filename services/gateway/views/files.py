"""`/v1/files`: upload (deduplicated, within the owner's quota, with an expiry), list, retrieve, download, delete."""

import asyncio
import contextlib
import logging
from typing import get_args

import orjson
from aiohttp import BodyPartReader, MultipartReader, web
from aiohttp.http_exceptions import HttpProcessingError
from minio.error import S3Error

from contracts.api.file import MAX_FILENAME, FileObject, FilePurpose
from contracts.api.model import MAX_MODEL_NAME
from contracts.ids import new_file_id
from contracts.subjects import input_object_key
from services.gateway.adapters.upload import StoredUpload, store_unavailable, stream_part_to_store
from services.gateway.context import Deps, deps
from services.gateway.http.auth import principal
from services.gateway.http.bodies import answer, read_capped
from services.gateway.http.body_pace import BodyPace
from services.gateway.http.disposition import content_disposition
from services.gateway.http.limits import charge_control_call
from services.gateway.http.paging import MAX_FILES_LIMIT, page_after, parse_limit
from services.gateway.http.transfer_slots import DOWNLOAD_SLOTS, UPLOAD_SLOTS
from services.gateway.usecases import files as usecase
from services.gateway.usecases.files import discard_object, is_valid_id, owned_file, owner_files
from services.gateway.usecases.refusals import ascii_int, bad_request, not_found
from services.runtime.storage.objectstore import TRANSIENT, ObjectNotFound

log = logging.getLogger(__name__)
MIN_EXPIRES_AFTER_S, MAX_EXPIRES_AFTER_S = 3600, 30 * 24 * 3600
FORM_FIELD_BYTES = 1024
CONTENT_SHA256 = "X-Sheshnag-Content-SHA256"
DEFAULT_FILENAME = "upload.jsonl"


def expires_after_seconds(anchor: str | None, seconds: str | None) -> int | None:
    """The SDK's `expires_after={"anchor": "created_at", "seconds": N}`, sent as two form fields."""
    if anchor is None and seconds is None:
        return None
    amount = ascii_int(seconds, 12)
    if anchor != "created_at" or amount is None or not MIN_EXPIRES_AFTER_S <= amount <= MAX_EXPIRES_AFTER_S:
        raise bad_request(f"expires_after must be {{'anchor': 'created_at', 'seconds': N}} with N between "
                          f"{MIN_EXPIRES_AFTER_S} and {MAX_EXPIRES_AFTER_S}.", "invalid_expires_after", "expires_after")
    return amount


async def form_field(part: BodyPartReader) -> str:
    value = await read_capped(part.read_chunk, FORM_FIELD_BYTES)
    if value is None:
        raise bad_request(f"Form field '{part.name}' is longer than {FORM_FIELD_BYTES} bytes.",
                          "invalid_form_field", part.name)
    try:
        return value.decode().strip()
    except UnicodeDecodeError:
        raise bad_request(f"Form field '{part.name}' is not UTF-8.", "invalid_form_field", part.name) from None


def is_utf8(text: str) -> bool:
    """Whether `text` is text UTF-8 can write: aiohttp hands on bytes that are not UTF-8 as lone surrogates, which
    no fact can hold."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def upload_filename(given: str | None) -> str:
    """The name the file part gives (`upload.jsonl` without one): UTF-8 of at most `MAX_FILENAME` characters."""
    if not given:
        return DEFAULT_FILENAME
    if len(given) > MAX_FILENAME or not is_utf8(given):
        raise bad_request(f"The file's name must be UTF-8 text of at most {MAX_FILENAME} characters.",
                          "invalid_filename", "file")
    return given


class _Upload:
    """The parts of one multipart upload, read in one pass; the file part goes straight to the store."""

    def __init__(self) -> None:
        self.fields: dict[str, str] = {}
        self.stored: StoredUpload | None = None
        self.filename = DEFAULT_FILENAME

    async def read(self, reader: MultipartReader, d: Deps, object_key: str, pace: BodyPace) -> None:
        while (part := await pace.read(reader.next())) is not None:
            if not isinstance(part, BodyPartReader):
                raise bad_request("Nested multipart bodies are not accepted.", "invalid_multipart")
            if part.name == "file" and self.stored is None:
                self.filename = upload_filename(part.filename)  # refused before anything is stored
                self.stored = await stream_part_to_store(part, d.store, object_key, d.settings.max_upload_bytes,
                                                         pace, d.settings.object_store_timeout_s)
            elif part.name in ("purpose", "expires_after", "expires_after[anchor]", "expires_after[seconds]"):
                self.fields[part.name] = await pace.read(form_field(part))

    def expires_after_s(self) -> int | None:
        if "expires_after" not in self.fields:
            return expires_after_seconds(self.fields.get("expires_after[anchor]"),
                                         self.fields.get("expires_after[seconds]"))
        try:
            value = orjson.loads(self.fields["expires_after"])
        except orjson.JSONDecodeError:
            value = None
        if not isinstance(value, dict):
            raise bad_request("expires_after must be a JSON object.", "invalid_expires_after", "expires_after")
        return expires_after_seconds(str(value.get("anchor")), str(value.get("seconds")))

    def new_file(self, file_id: str, object_key: str, model: str | None) -> usecase.NewFile:
        """What the form asks for, checked (400 without a file, for a wrong purpose or expiry)."""
        if self.stored is None:
            raise bad_request("The 'file' field is missing.", "missing_file", "file")
        return usecase.NewFile(file_id, object_key, self.stored, self.filename,
                               usecase.uploadable(self.fields.get("purpose")), self.expires_after_s(), model)


async def _read_upload(request: web.Request, d: Deps, file_id: str, model: str | None) -> usecase.NewFile:
    """The upload, stored, with its form checked; nothing is kept of one refused or broken."""
    upload, object_key = _Upload(), input_object_key(file_id)
    settings = d.settings
    try:
        try:
            async with request.app[UPLOAD_SLOTS].slot(principal(request).owner):
                # The pace starts with the slot: time spent waiting for one is never the client's.
                pace = BodyPace(lambda: request.content.total_bytes, settings.client_idle_timeout_s,
                                settings.upload_min_bytes_per_s, settings.upload_min_rate_window_s)
                await upload.read(await request.multipart(), d, object_key, pace)
        except (ValueError, AssertionError, LookupError, HttpProcessingError) as broken:
            # aiohttp's multipart parser says "malformed" with these.
            raise bad_request(f"The multipart body could not be read ({type(broken).__name__}).",
                              "invalid_multipart") from None
        return upload.new_file(file_id, object_key, model)
    except BaseException:
        if upload.stored is not None:
            await asyncio.shield(discard_object(d, object_key))
        raise


UPLOAD_MODEL_HEADER = "x-litellm-model"


def upload_model(request: web.Request) -> str | None:
    """The model an upload names for its lines that name none (LiteLLM's header, or `?model=`), if any."""
    name = request.headers.get(UPLOAD_MODEL_HEADER) or request.query.get("model")
    if name is None:
        return None
    if not name.strip() or len(name) > MAX_MODEL_NAME or not is_utf8(name):
        raise bad_request(f"The model named at upload must be a model id (UTF-8) of at most {MAX_MODEL_NAME} "
                          "characters (see GET /v1/models).", "invalid_model", UPLOAD_MODEL_HEADER)
    return name.strip()


async def create_file(request: web.Request) -> web.Response:
    if not request.content_type.startswith("multipart/"):
        raise bad_request("Upload a file as multipart/form-data with fields 'purpose' and 'file'.",
                          "invalid_content_type")
    model = upload_model(request)
    await charge_control_call(request)
    d = deps(request)
    new = await _read_upload(request, d, new_file_id(), model)
    return answer(*await usecase.create_file(d, principal(request), new))


LISTED_ONLY_PURPOSES = ("evals",)
"""Purposes OpenAI's file list takes that no file here has: listing them finds none, as it would."""
LISTED_PURPOSES = sorted((*get_args(FilePurpose), *LISTED_ONLY_PURPOSES))


async def list_files(request: web.Request) -> web.Response:
    purpose = request.query.get("purpose")
    if purpose is not None and purpose not in LISTED_PURPOSES:
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
    ids, after = [f.id for f in mine], request.query.get("after")
    gone_at = await _where_it_stood(d, owner, after, mine, order == "desc") if after and after not in ids else None
    return answer(page_after(mine, ids, after, limit, gone_at))


async def _where_it_stood(d: Deps, owner: str, file_id: str, listed: list[FileObject], descending: bool) -> int | None:
    """The index in `listed` of the first file past the owner's file `file_id` (deleted, or of another purpose: the
    cursor a client pages on from while deleting what it lists); None when the owner never had it."""
    record = await d.read_model.get_file(file_id) if is_valid_id(file_id) else None
    if record is None or record.owner != owner:
        return None
    cursor = (record.file.created_at, record.file.id)
    return next((n for n, f in enumerate(listed) if ((f.created_at, f.id) < cursor) == descending
                 and (f.created_at, f.id) != cursor), len(listed))


async def retrieve_file(request: web.Request) -> web.Response:
    record = await owned_file(deps(request), principal(request), request.match_info["file_id"])
    return answer(record.file)


async def file_content(request: web.Request) -> web.StreamResponse:
    d = deps(request)
    record = await owned_file(d, principal(request), request.match_info["file_id"])
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
            if request.method == "HEAD":  # the headers GET would send, and no body
                await response.write_eof()
                return response
            idle_s = d.settings.client_idle_timeout_s
            try:  # the client takes each part within idle_s, else a TimeoutError (an OSError: one of TRANSIENT)
                async with asyncio.timeout(idle_s):
                    await response.write(first)
                async for chunk in chunks:
                    async with asyncio.timeout(idle_s):
                        await response.write(chunk)
            except (S3Error, *TRANSIENT) as broken:
                # The status is sent already: cut the connection so the client sees a short body, not a whole file.
                log.info("download of %s ended early: %r", record.file.id, broken)
                if request.transport is not None:
                    request.transport.abort()  # close() would wait for buffers a stalled client never drains
                return response
            await response.write_eof()
    return response


async def delete_file(request: web.Request) -> web.Response:
    d = deps(request)
    record = await owned_file(d, principal(request), request.match_info["file_id"])
    await charge_control_call(request)
    return answer(await usecase.delete_file(d, record))
