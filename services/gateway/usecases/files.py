"""Files: the rules of `POST/GET/DELETE /v1/files` that are not HTTP: which file a caller may see, what an upload
must be, the same upload again, the owner's storage quota, and a deletion that never takes the input of a live batch
(also the sweeper's)."""

import asyncio
import logging
import re
import time
from dataclasses import dataclass

from minio.error import S3Error

from contracts.api.field_errors import GIVEN_CHARS
from contracts.api.file import FileDeleted, FileObject
from contracts.events.file import FileDeleted as FileDeletedEvent
from contracts.events.file import FileStored, FileUsed
from contracts.lifecycle import TERMINAL
from contracts.readmodel import ApiKeyRecord, FileRecord
from contracts.subjects import file_fact
from services.gateway.adapters.admission import Holdings, Read
from services.gateway.adapters.upload import StoredUpload
from services.gateway.context import Deps
from services.gateway.usecases.refusals import ApiError, bad_request, not_found
from services.runtime.nats.bus import Fence, FenceMoved
from services.runtime.nats.facts import last_fact
from services.runtime.nats.readmodel import ReadModel
from services.runtime.nats.stored_bytes import part_of
from services.runtime.storage.objectstore import TRANSIENT

log = logging.getLogger(__name__)

ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,128}")
"""Every id we hand out; anything else (`../x`, `a%2Fb`, spaces) names nothing."""
UPLOADABLE_PURPOSES = ("batch",)
STORED_BYTES = "stored_bytes"
CLAIM_GRACE_S = 300
"""How long a `used` fact whose batch never appeared (its create died) holds the file."""


def quota_item(file_id: str, sha256: str) -> str:
    """An upload's entry among its owner's storage reservations: its id, and the part of the owner's stored bytes
    that will count it (so a reservation is told from a counted file by one read)."""
    return f"{file_id}@{part_of(sha256)}"


def is_valid_id(ident: str) -> bool:
    return ID_PATTERN.fullmatch(ident) is not None


def is_expired(record: FileRecord, now: float | None = None) -> bool:
    expires_at = record.file.expires_at
    return expires_at is not None and expires_at <= (time.time() if now is None else now)


async def owned_file(d: Deps, caller: ApiKeyRecord, file_id: str) -> FileRecord:
    """The caller's file, if it exists (not deleted, not expired); anyone else's is not found."""
    owner = caller.owner
    record = await d.read_model.get_file(file_id) if is_valid_id(file_id) else None
    if record is None and d.own_writes.awaits(owner, "file", file_id):  # uploaded here a moment ago
        await d.own_writes.settle(d.read_model, owner, ("file",), d.settings.own_writes_wait_s)
        record = await d.read_model.get_file(file_id)
        if record is None and d.own_writes.awaits(owner, "file", file_id):  # stored, not folded yet: never a 404
            raise ApiError(503, f"File {file_id} is stored but the ledger has not caught up with it yet; try again "
                                "shortly.", "server_error", "ledger_behind", retry_after_s=2)
    if record is None or record.deleted or record.owner != owner or is_expired(record):
        raise not_found("file", file_id)
    return record


async def owner_files(d: Deps, owner: str) -> list[FileRecord]:
    """The owner's files that still exist, from one index read shared by the requests in flight (never changed)."""
    now = time.time()
    indexed = await d.shared_reads.read(("files", owner), lambda: d.read_model.owner_files(owner))
    return [r for r in indexed if not r.deleted and not is_expired(r, now)]


async def same_bytes(d: Deps, owner: str, sha256: str) -> list[FileRecord]:
    """The owner's files with these bytes that still exist, found by their digest."""
    file_ids = await d.read_model.owner_file_ids_by_sha256(owner, sha256)
    records = await asyncio.gather(*(d.read_model.get_file(file_id) for file_id in file_ids))
    now = time.time()
    return [r for r in records if r is not None and r.owner == owner and not r.deleted and not is_expired(r, now)]


async def discard_object(d: Deps, object_key: str) -> None:
    """Remove what a refused upload stored; a store that is down keeps an object no fact names (harmless)."""
    try:
        await d.store.remove(object_key)
    except (S3Error, *TRANSIENT) as error:
        log.warning("could not remove refused upload %s: %r", object_key, error)


def uploadable(purpose: str | None) -> str:
    """The purpose an upload names, if files of it may be uploaded; else 400."""
    if purpose not in UPLOADABLE_PURPOSES:
        raise bad_request(f"purpose must be one of: {', '.join(UPLOADABLE_PURPOSES)} (got "
                          f"{'nothing' if purpose is None else repr(purpose[:GIVEN_CHARS])}).",
                          "invalid_purpose", "purpose")
    return purpose


@dataclass(frozen=True)
class NewFile:
    """An upload already in the store under `object_key`, with what its form asked for."""

    file_id: str
    object_key: str
    stored: StoredUpload
    filename: str
    purpose: str
    expires_after_s: int | None
    """None: the deployment's default."""
    model: str | None
    """The model the upload names for its lines that name none."""


async def create_file(d: Deps, caller: ApiKeyRecord, new: NewFile) -> tuple[FileObject, str | None]:
    """State the stored upload as the caller's file: the file, and the earlier file's id when it is the same."""
    owner = caller.owner
    ttl_s = new.expires_after_s or d.settings.batch_file_ttl_s
    # Anything that differs from an earlier upload is a file object of its own, even with the same bytes.
    same = next((r for r in await same_bytes(d, owner, new.stored.sha256) if r.file.purpose == new.purpose
                 and r.file.filename == new.filename and r.model == new.model
                 and (r.file.expires_at or 0) - r.file.created_at == ttl_s), None)
    # The log decides whether it still exists: a delete the read model does not show yet removed its bytes.
    if same is not None and await last_fact(d.bus, file_fact(same.file.id, "deleted")) is None:
        await discard_object(d, new.object_key)
        return same.file, same.file.id
    event, sequence = await state_file(d, caller, new, ttl_s)
    record = await d.folds.read_back(lambda: d.read_model.get_file(new.file_id), sequence,
                                     d.settings.read_your_writes_s)
    if record is None:
        d.own_writes.note(owner, "file", new.file_id)  # the owner's next list waits for it
    else:
        d.admission.shown(quota_item(new.file_id, new.stored.sha256))
    file = record.file if record else FileObject(id=new.file_id, bytes=event.bytes, created_at=event.created_at,
                                                 filename=new.filename, purpose="batch", expires_at=event.expires_at)
    return file, None


def stored_holdings(read_model: ReadModel, owner: str) -> Read:
    """What the owner's storage reservations are read against: the owner's stored bytes (not every file of theirs).
    A listed upload is counted once: in the bytes when its part of them holds it, else as still pending."""

    async def held(listed: frozenset[str]) -> Holdings:
        reserved = {item: item.partition("@")[::2] for item in listed}  # item: (file id, part)
        bare = [item for item, (_, part) in reserved.items() if not part]
        # An older gateway's reservation names no part: its record is read first, then the bytes (a file's bytes are
        # counted before its record shows it, so one it shows is in the bytes read after).
        bare_shown = await asyncio.gather(*(read_model.get_file(item) for item in bare))
        parts = {part for _, part in reserved.values() if part}
        stored, counted = await read_model.owner_stored_files(owner, parts, time.time())
        in_bytes = {item for item, (file_id, part) in reserved.items() if part and file_id in counted[part]}
        others = [item for item, (_, part) in reserved.items() if part and item not in in_bytes]
        # Read after the bytes: a deleted file is gone from them, and no longer pending; one stored meanwhile is not
        # in the bytes read before, so it is still counted as pending.
        records = await asyncio.gather(*(read_model.get_file(reserved[item][0]) for item in others))
        known = in_bytes | {item for item, record in zip(others, records, strict=True) if record and record.deleted}
        known |= {item for item, record in zip(bare, bare_shown, strict=True) if record is not None}
        return Holdings({STORED_BYTES: stored}, frozenset(known))

    return held


async def state_file(d: Deps, caller: ApiKeyRecord, new: NewFile, ttl_s: int, once: bool = False,
                     ) -> tuple[FileStored, int]:
    """State the stored object as the caller's file for `ttl_s`, its bytes taken from the owner's quota (else 400).
    `once`: the file id is derived (a retry's copy), so a concurrent request may state it first: then that one holds,
    this object is removed, and the fact and sequence returned are the first's."""
    owner, file_id = caller.owner, new.file_id

    quota, size = d.settings.storage_quota_bytes, new.stored.bytes
    try:
        item = quota_item(file_id, new.stored.sha256)
        if (used := await d.admission.take(STORED_BYTES, owner, item, size, quota,
                                           stored_holdings(d.read_model, owner))) is not None:
            raise bad_request(f"Storing {size} more bytes would exceed your storage quota of {quota} bytes ({used} "
                              "in use); delete files first.", "storage_quota_exceeded", "file")
    except ApiError:  # refused, or the admission could not answer
        await discard_object(d, new.object_key)
        raise
    now, stored = int(time.time()), new.stored
    event = FileStored(aggregate_id=file_id, owner_key_id=caller.key_id, filename=new.filename,
                       purpose="batch", bytes=stored.bytes, sha256=stored.sha256, object_key=new.object_key,
                       created_at=now, line_count=stored.line_count, expires_at=now + ttl_s, model=new.model,
                       demand=stored.demand)
    if not once:
        return event, await d.bus.publish(event)
    try:  # within the broker's dedup window a second publish is taken as a repeat of the first, fence or not
        await d.bus.publish(event, fence=Fence(file_fact(file_id, "stored"), 0))
    except FenceMoved:
        pass
    if (first := await stated_file(d, file_id)) is None:  # taken (or refused as a repeat), yet not readable now
        await discard_object(d, new.object_key)
        raise ApiError(503, "The file's record could not be read back from the log; retry shortly.", "server_error",
                       "broker_unavailable", retry_after_s=1)
    if first[1].object_key != new.object_key:
        await discard_object(d, new.object_key)  # this request's own copy: the first one's is the file
    return first[1], first[0]


async def stated_file(d: Deps, file_id: str) -> tuple[int, FileStored] | None:
    """The file's `stored` fact and its sequence, from the log; None if it was never stated."""
    found = await last_fact(d.bus, file_fact(file_id, "stored"))
    return (found[0], found[1]) if found is not None and isinstance(found[1], FileStored) else None


async def last_claim(d: Deps, file_id: str) -> tuple[int, str | None]:
    """The sequence of the file's last `used` fact (0: none), and its batch if that may still be live."""
    found = await last_fact(d.bus, file_fact(file_id, "used"))
    if found is None:
        return 0, None
    sequence, used = found
    if not isinstance(used, FileUsed):
        return sequence, None
    fresh = time.time() - used.occurred_at / 1000 < CLAIM_GRACE_S
    record = await d.read_model.get_batch(used.batch_id)
    if record is None:
        return sequence, used.batch_id if fresh else None
    if record.batch.input_file_id != file_id:
        # A create that lost its Idempotency-Key to one on another file: its claim holds only a while, as one whose
        # batch never appeared (not till that other batch ends); meanwhile it covers an earlier create on this file
        # that the read model may not show yet.
        return sequence, used.batch_id if fresh else None
    return sequence, None if record.batch.status in TERMINAL else used.batch_id


async def delete_unless_in_use(d: Deps, record: FileRecord) -> str | None:
    """Delete the file (a repeat is harmless: deduplicated fact id) unless a batch that has not ended reads it: then
    that batch's id. A racing create wins or loses whole: the deletion is fenced on the file's last `used` fact."""
    file_id = record.file.id
    claimed_at, claimed_by = await last_claim(d, file_id)
    if claimed_by is not None:
        return claimed_by
    if using := await d.read_model.owner_live_batches(record.owner, file_id):  # those reading the file alone
        return using[0].batch.id
    try:
        sequence = await d.bus.publish(FileDeletedEvent(aggregate_id=file_id, owner_key_id=record.owner_key_id),
                                       fence=Fence(file_fact(file_id, "used"), claimed_at))
    except FenceMoved:
        return (await last_claim(d, file_id))[1] or "being created"
    folded = await d.folds.read_back(lambda: d.read_model.get_file(file_id), sequence, d.settings.read_your_writes_s,
                                     lambda r: r.deleted)
    if folded is None or not folded.deleted:
        d.own_writes.note(record.owner, "file_deleted", file_id)  # the owner's next list waits for it
    await d.store.remove(record.object_key)
    return None


async def delete_file(d: Deps, record: FileRecord) -> FileDeleted:
    """Delete the caller's file, or 409 `file_in_use` while a batch that has not ended reads it."""
    file_id = record.file.id
    batch_id = await delete_unless_in_use(d, record)
    if batch_id is not None:
        raise ApiError(409, f"File {file_id} is the input of batch {batch_id}, which has not ended; cancel it or "
                       "wait for it to end before deleting the file.", "invalid_request_error", "file_in_use",
                       "file_id")
    return FileDeleted(id=file_id, deleted=True)
