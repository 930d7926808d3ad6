"""What a read-model record is filed as besides its own key (pure rules): a batch's or file's entry in its owner's
index, an account's overdrawn mark, a record under who holds it, each owner's live list. The writer (readmodel.py)
files them; a replay (ledger/replay.py) makes the same ones to compare."""

import re
from collections import defaultdict
from typing import Any

from pydantic import BaseModel, model_validator

from contracts.lifecycle import TERMINAL
from contracts.readmodel import (
    AccountRecord,
    ApiKeyRecord,
    BatchRecord,
    ExecutorRecord,
    Filed,
    FileRecord,
    KeyDigest,
    LiveBatches,
    ProviderRecord,
    UserRecord,
)
from contracts.subjects import filed_key, key_id_key, overdrawn_key, owner_index_key, read_model_key

KV_TOKEN = re.compile(r"[A-Za-z0-9_-]+")
"""What a KV key's token may be (anything else is never filed under it)."""

class BatchIndexEntry(BaseModel):
    """What an owner's index holds of one of their batches: only what never changes, so it is written once and a
    list is ordered and paged from the index before the page's records are read by id."""

    id: str
    created_at: int

    @model_validator(mode="before")
    @classmethod
    def _from_full_record(cls, data: Any) -> Any:
        """A read model written before the index held entries keeps a whole `BatchRecord` there."""
        if isinstance(data, dict) and isinstance(data.get("batch"), dict):
            return {"id": data["batch"].get("id"), "created_at": data["batch"].get("created_at")}
        return data


def owner_copy(record: BatchRecord | FileRecord) -> tuple[str, bool]:
    """Where the owner's entry for a record lives, and whether it is kept (a deleted file leaves the index)."""
    if isinstance(record, BatchRecord):
        return owner_index_key(record.owner, "batch", record.batch.id), True
    return owner_index_key(record.owner, "file", record.file.id), not record.deleted


def owner_entry(record: BatchRecord | FileRecord) -> BaseModel:
    """What the owner's index keeps of a record: a batch's entry, a file's whole record (files change rarely)."""
    if isinstance(record, BatchRecord):
        return BatchIndexEntry(id=record.batch.id, created_at=record.batch.created_at)
    return record


def side_entries(record: BaseModel) -> dict[str, BaseModel | None]:
    """The entries that come and go with a record (None: erased): a batch's or file's owner copy, an account's mark
    of being overdrawn."""
    if isinstance(record, BatchRecord | FileRecord):
        copy_key, kept = owner_copy(record)
        return {copy_key: owner_entry(record) if kept else None}
    if isinstance(record, AccountRecord) and KV_TOKEN.fullmatch(record.account_id):
        return {overdrawn_key(record.account_id): Filed(record.account_id) if record.overdrawn else None}
    return {}


def holder_entries(key: str, record: BaseModel, provider_of_key: str | None = None) -> dict[str, BaseModel]:
    """What a record at `key` is filed as under who holds it: a key's record under each of its holders and its
    SHA-256 under its id, a provider's under its owner, an executor's under its provider (the one its registration
    named, else `provider_of_key`: its worker key's, for a registration made before they named it), a user's under
    its organisation. A token a KV key cannot hold is filed under nothing."""
    entries: dict[str, BaseModel] = {}
    if isinstance(record, ApiKeyRecord):
        digest = key.removeprefix(read_model_key("apikey", ""))
        entries.update((filed_key("keys", holder, digest), record) for holder in record.holders
                       if KV_TOKEN.fullmatch(holder))
        if KV_TOKEN.fullmatch(record.key_id):
            entries[key_id_key(record.key_id)] = KeyDigest(digest)
    elif isinstance(record, ProviderRecord):
        if KV_TOKEN.fullmatch(record.owner) and KV_TOKEN.fullmatch(record.provider_id):
            entries[filed_key("providers", record.owner, record.provider_id)] = record
    elif isinstance(record, ExecutorRecord):
        provider_id = record.provider_id or provider_of_key
        if provider_id is not None and KV_TOKEN.fullmatch(provider_id) and KV_TOKEN.fullmatch(record.executor_id):
            entries[filed_key("executors", provider_id, record.executor_id)] = Filed(record.executor_id)
    elif isinstance(record, UserRecord):
        if KV_TOKEN.fullmatch(record.organization) and KV_TOKEN.fullmatch(record.user_id):
            entries[filed_key("members", record.organization, record.user_id)] = record
    return entries


def live_lists(records: list[BatchRecord]) -> dict[str, LiveBatches]:
    """Each owner's list of live batches as `records` show them (an owner whose batches all ended: an empty list)."""
    live: defaultdict[str, dict[str, str]] = defaultdict(dict)
    for record in records:
        ids = live[record.owner]
        if record.batch.status not in TERMINAL:
            ids[record.batch.id] = record.batch.input_file_id
    return {owner: LiveBatches(dict(sorted(ids.items()))) for owner, ids in live.items()}
