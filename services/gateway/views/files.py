"""`/v1/files`: upload, list, retrieve, download and delete files."""

import time
from typing import get_args

from aiohttp import BodyPartReader, web

from contracts.api.file import FileDeleted, FileObject, FilePurpose
from contracts.events.file import FileDeleted as FileDeletedEvent
from contracts.events.file import FileStored
from contracts.ids import new_file_id
from contracts.readmodel import FileRecord
from contracts.subjects import input_object_key
from services.gateway.auth import principal
from services.gateway.context import deps
from services.gateway.errors import bad_request, not_found
from services.gateway.upload import stream_part_to_store
from services.gateway.views.paging import page_after, parse_limit

UPLOADABLE_PURPOSES = ("batch",)


async def owned_file(request: web.Request, file_id: str) -> FileRecord:
    record = await deps(request).read_model.get_file(file_id)
    if record is None or record.deleted or record.owner_key_id != principal(request).key_id:
        raise not_found("file", file_id)
    return record


async def create_file(request: web.Request) -> web.Response:
    if not request.content_type.startswith("multipart/"):
        raise bad_request("Upload a file as multipart/form-data with fields 'purpose' and 'file'.",
                          "invalid_content_type")
    d = deps(request)
    reader = await request.multipart()
    purpose: str | None = None
    file_id = new_file_id()
    stored = None
    filename = "upload.jsonl"
    while (part := await reader.next()) is not None:
        if not isinstance(part, BodyPartReader):
            continue
        if part.name == "purpose":
            purpose = (await part.text()).strip()
        elif part.name == "file" and stored is None:
            filename = part.filename or filename
            stored = await stream_part_to_store(part, d.store, input_object_key(file_id),
                                                d.settings.max_upload_bytes)
    if stored is None:
        raise bad_request("The 'file' field is missing.", "missing_file", "file")
    if purpose not in UPLOADABLE_PURPOSES:
        await d.store.remove(input_object_key(file_id))
        allowed = ", ".join(UPLOADABLE_PURPOSES)
        raise bad_request(f"purpose must be one of: {allowed} (got {purpose!r}).", "invalid_purpose", "purpose")
    event = FileStored(aggregate_id=file_id, owner_key_id=principal(request).key_id, filename=filename,
                       purpose="batch", bytes=stored.bytes, sha256=stored.sha256,
                       object_key=input_object_key(file_id), created_at=int(time.time()),
                       line_count=stored.line_count)
    await d.bus.publish(event)
    record = await d.read_model.wait_for(lambda: d.read_model.get_file(file_id), lambda r: True,
                                         d.settings.read_your_writes_s)
    file = record.file if record else FileObject(id=file_id, bytes=event.bytes, created_at=event.created_at,
                                                 filename=filename, purpose="batch")
    return web.json_response(file.model_dump(mode="json"))


async def list_files(request: web.Request) -> web.Response:
    purpose = request.query.get("purpose")
    if purpose is not None and purpose not in get_args(FilePurpose):
        raise bad_request(f"Unknown purpose {purpose!r}.", "invalid_purpose", "purpose")
    records = await deps(request).read_model.list_files()
    mine = [r.file for r in records if r.owner_key_id == principal(request).key_id and not r.deleted
            and (purpose is None or r.file.purpose == purpose)]
    ascending = request.query.get("order", "desc") == "asc"
    mine.sort(key=lambda f: (f.created_at, f.id), reverse=not ascending)
    page = page_after(mine, [f.id for f in mine], request.query.get("after"), parse_limit(request, 100))
    return web.json_response(page.model_dump(mode="json"))


async def retrieve_file(request: web.Request) -> web.Response:
    record = await owned_file(request, request.match_info["file_id"])
    return web.json_response(record.file.model_dump(mode="json"))


async def file_content(request: web.Request) -> web.StreamResponse:
    record = await owned_file(request, request.match_info["file_id"])
    response = web.StreamResponse(headers={"Content-Type": "application/octet-stream",
                                           "Content-Length": str(record.file.bytes)})
    await response.prepare(request)
    async for chunk in deps(request).store.iter_chunks(record.object_key):
        await response.write(chunk)
    await response.write_eof()
    return response


async def delete_file(request: web.Request) -> web.Response:
    d = deps(request)
    file_id = request.match_info["file_id"]
    record = await owned_file(request, file_id)
    await d.bus.publish(FileDeletedEvent(aggregate_id=file_id, owner_key_id=record.owner_key_id))
    await d.read_model.wait_for(lambda: d.read_model.get_file(file_id), lambda r: r.deleted,
                                d.settings.read_your_writes_s)
    return web.json_response(FileDeleted(id=file_id, deleted=True).model_dump())
