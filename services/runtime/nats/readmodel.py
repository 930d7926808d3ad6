"""The read model: OpenAI-shaped records in a KV bucket, written by the ledger and read by the gateway."""

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from pydantic import BaseModel

from contracts.lifecycle import TERMINAL
from contracts.readmodel import (
    AccountRecord,
    AnomalyRecord,
    ApiKeyRecord,
    BatchRecord,
    ExecutorRecord,
    Filed,
    FileRecord,
    HoldersIndexed,
    KeyDigest,
    LiveBatches,
    OrganizationRecord,
    ProviderRecord,
    UserRecord,
)
from contracts.subjects import (
    HOLDERS_INDEXED_KEY,
    MEMBERS_INDEXED_KEY,
    OVERDRAWN,
    OVERDRAWN_INDEXED_KEY,
    READ_MODEL_BUCKET,
    filed_under,
    key_id_key,
    overdrawn_key,
    owner_live_key,
    read_model_key,
)
from services.runtime.nats.bus import EventBus
from services.runtime.nats.kv import (
    Bucket,
    erase,
    latest_entries,
    latest_values,
    open_bucket,
    read_last,
    read_latest,
)
from services.runtime.nats.owner_reads import OwnerReads
from services.runtime.nats.read_entries import KV_TOKEN, holder_entries, live_lists, owner_copy, owner_entry
from services.runtime.nats.records import Record, keyed_records
from services.runtime.nats.records import record as decoded
from services.runtime.nats.records import records as decoded_all
from services.runtime.nats.stored_bytes import (
    StoredBytesWriter,
    with_entry,
)
from services.runtime.process.keyed_locks import KeyedLocks

KEY_PROVIDERS_KEPT = 65_536
"""Worker keys whose provider the writer remembers (past this the oldest are looked up again)."""
INDEXED_KEPT = 65_536
"""Ended batches the writer remembers having filed in their owner's index (a live one's entry is known from the
owner's live list): a later change to one it forgot files the same entry again, harmlessly."""


class ReadModel(OwnerReads):
    """Every record by its id, the lists of who holds what, and the one write (`put`) the ledger makes."""

    def __init__(self, kv: Bucket) -> None:
        super().__init__(kv)
        self._live: dict[str, dict[str, str]] = {}
        """The writer's copy of each touched owner's live-batch list (as last put); owners with none are dropped."""
        self._live_locks = KeyedLocks()
        self._indexed: OrderedDict[str, None] = OrderedDict()
        """The owner index keys of ended batches this writer filed (or found filed), the last `INDEXED_KEPT`."""
        self._stored = StoredBytesWriter(kv)
        self._marked: set[str] = set()
        """The index marks (`HOLDERS_INDEXED_KEY`, `MEMBERS_INDEXED_KEY`, `OVERDRAWN_INDEXED_KEY`) found present: once
        there, always."""
        self._key_providers: OrderedDict[str, str | None] = OrderedDict()
        self._filed: OrderedDict[str, None] = OrderedDict()
        """The entries of records filed by id this writer wrote (the last `INDEXED_KEPT`)."""
        self._overdrawn: OrderedDict[str, bool] = OrderedDict()
        """Whether each account's `overdrawn_key` is there as this writer last put or erased it (the last
        `INDEXED_KEPT`): an account not known is put or erased at its next write."""

    @classmethod
    async def open(cls, bus: EventBus) -> "ReadModel":
        return cls(await open_bucket(bus, READ_MODEL_BUCKET, scans=True))

    async def _scan(self, prefix: str, model: type[Record]) -> list[Record]:
        return decoded_all(model, await latest_values(self.kv, f"{prefix}.>"), prefix)

    async def get_file(self, file_id: str) -> FileRecord | None:
        return await self._get(read_model_key("file", file_id), FileRecord)

    async def get_api_key(self, key_sha256: str) -> ApiKeyRecord | None:
        return await self._get(read_model_key("apikey", key_sha256), ApiKeyRecord)

    async def get_user(self, user_id: str) -> UserRecord | None:
        return await self._get(read_model_key("user", user_id), UserRecord)

    async def list_users(self) -> list[UserRecord]:
        return await self._scan("user", UserRecord)

    async def organization_members(self, organization: str) -> list[UserRecord]:
        """The users of `organization` (`UserRecord.organization`): those filed under it, once every user is."""
        if not await self._is_marked(MEMBERS_INDEXED_KEY):
            return [user for user in await self.list_users() if user.organization == organization]
        if not KV_TOKEN.fullmatch(organization):
            return []  # never filed under such an organisation
        return decoded_all(UserRecord, await latest_values(self.kv, filed_under("members", organization)), "members")

    async def list_api_keys(self) -> list[tuple[str, ApiKeyRecord]]:
        """Every key with its SHA-256 (the read-model key), for admins; raw values are never stored."""
        return [(entry_key.removeprefix("apikey."), found)
                for entry_key, found in keyed_records(ApiKeyRecord, await latest_entries(self.kv, "apikey.>"))]

    async def held_api_keys(self, holder: str) -> list[tuple[str, ApiKeyRecord]]:
        """The keys filed under `holder` (`ApiKeyRecord.holders`), revoked ones too, each with its SHA-256; a read
        model whose keys are not indexed yet is read whole."""
        if not await self.holders_indexed():
            return [(digest, record) for digest, record in await self.list_api_keys() if holder in record.holders]
        if not KV_TOKEN.fullmatch(holder):
            return []  # never filed under such a holder
        return [(entry_key.rsplit(".", 1)[1], found) for entry_key, found in
                keyed_records(ApiKeyRecord, await latest_entries(self.kv, filed_under("keys", holder)))]

    async def find_api_key(self, key_id: str) -> tuple[str, ApiKeyRecord] | None:
        """The SHA-256 and record of the key with this public id (None for an id no key could have)."""
        filed = await read_latest(self.kv, key_id_key(key_id)) if KV_TOKEN.fullmatch(key_id) else None
        if filed is None:
            if await self.holders_indexed():
                return None
            return next(((d, r) for d, r in await self.list_api_keys() if r.key_id == key_id), None)
        filed_digest = decoded(KeyDigest, filed, key_id_key(key_id))
        if filed_digest is None:
            return None
        digest = filed_digest.root
        found = await self.get_api_key(digest)
        return None if found is None else (digest, found)

    async def owner_providers(self, owner: str) -> list[ProviderRecord]:
        """The providers filed under `owner` (a read model not indexed yet is read whole)."""
        if not await self.holders_indexed():
            return [record for record in await self.list_providers() if record.owner == owner]
        if not KV_TOKEN.fullmatch(owner):
            return []
        return decoded_all(ProviderRecord, await latest_values(self.kv, filed_under("providers", owner)), "providers")

    async def provider_executors(self, provider_id: str) -> list[ExecutorRecord] | None:
        """The executors filed under the provider, their records read by id; None: a read model not indexed yet. An
        executor that registered with another provider since (its owner's) is filed there too, and is left out here:
        its record says whose it is now."""
        if not await self.holders_indexed():
            return None
        if not KV_TOKEN.fullmatch(provider_id):
            return []
        ids = [filed.root for filed in
               decoded_all(Filed, await latest_values(self.kv, filed_under("executors", provider_id)), "executors")]
        found = await read_last(self.kv, [read_model_key("executor", executor_id) for executor_id in ids])
        executors = decoded_all(ExecutorRecord, found.values(), "executor")
        return [record for record in executors if record.provider_id in (None, provider_id)]

    async def _provider_of_key(self, key_id: str) -> str | None:
        """The provider of a worker key (which never changes; the key is in the read model before any executor
        joins with it), remembered."""
        if key_id not in self._key_providers:
            found = await self.find_api_key(key_id)
            self._key_providers[key_id] = None if found is None else found[1].provider_id
            if len(self._key_providers) > KEY_PROVIDERS_KEPT:
                self._key_providers.popitem(last=False)
        return self._key_providers[key_id]

    async def holders_indexed(self) -> bool:
        """Whether every key, provider and executor is filed under its holders (`HOLDERS_INDEXED_KEY`)."""
        return await self._is_marked(HOLDERS_INDEXED_KEY)

    async def _is_marked(self, mark: str) -> bool:
        if mark not in self._marked and await read_latest(self.kv, mark) is not None:
            self._marked.add(mark)
        return mark in self._marked

    async def index_holders(self) -> int:
        """File every key and provider under its holders (executors are filed as the ledger writes them again);
        how many records."""
        records: list[tuple[str, BaseModel]] = [(read_model_key("apikey", digest), record)
                                                for digest, record in await self.list_api_keys()]
        records += [(read_model_key("provider", record.provider_id), record) for record in await self.list_providers()]
        for key, record in records:
            await self._file_under_holders(key, record)
        return len(records)

    async def index_members(self) -> int:
        """File every user under its organisation; how many users."""
        users = await self.list_users()
        for user in users:
            await self._file_under_holders(read_model_key("user", user.user_id), user)
        return len(users)

    async def mark_indexed(self, mark: str) -> None:
        """Say that an index is made (`HOLDERS_INDEXED_KEY`: every key, provider and executor is filed;
        `MEMBERS_INDEXED_KEY`: every user; `OVERDRAWN_INDEXED_KEY`: every overdrawn account)."""
        await self.kv.put(mark, HoldersIndexed(True).model_dump_json().encode())

    async def _file_under_holders(self, key: str, record: BaseModel) -> None:
        provider_of_key = None
        if isinstance(record, ExecutorRecord) and record.provider_id is None and record.worker_key_id is not None:
            provider_of_key = await self._provider_of_key(record.worker_key_id)
        for entry_key, entry in holder_entries(key, record, provider_of_key).items():
            once = isinstance(entry, Filed)  # the same at every change of the record: written once a lifetime
            if once and entry_key in self._filed:
                continue
            await self.kv.put(entry_key, entry.model_dump_json().encode())
            if once:
                self._filed[entry_key] = None
                if len(self._filed) > INDEXED_KEPT:
                    self._filed.popitem(last=False)

    async def get_executor(self, executor_id: str) -> ExecutorRecord | None:
        return await self._get(read_model_key("executor", executor_id), ExecutorRecord)

    async def get_provider(self, provider_id: str) -> ProviderRecord | None:
        return await self._get(read_model_key("provider", provider_id), ProviderRecord)

    async def list_providers(self) -> list[ProviderRecord]:
        return await self._scan("provider", ProviderRecord)

    async def list_executors(self) -> list[ExecutorRecord]:
        return await self._scan("executor", ExecutorRecord)

    async def list_anomalies(self) -> list[AnomalyRecord]:
        return await self._scan("anomaly", AnomalyRecord)

    async def list_batches(self) -> list[BatchRecord]:
        return await self._scan("batch", BatchRecord)

    async def index_stored_bytes(self) -> int:
        """Write every owner's stored bytes (once, for a read model made before them); how many owners have files."""
        return await self._stored.index(await self.list_files())

    async def get_organization(self, organization_id: str) -> OrganizationRecord | None:
        return await self._get(read_model_key("organization", organization_id), OrganizationRecord)

    async def list_organizations(self) -> list[OrganizationRecord]:
        return await self._scan("organization", OrganizationRecord)

    async def get_account(self, account_id: str) -> AccountRecord | None:
        return await self._get(read_model_key("account", account_id), AccountRecord)

    async def list_accounts(self) -> list[AccountRecord]:
        return await self._scan("account", AccountRecord)

    async def overdrawn_accounts(self) -> list[AccountRecord]:
        """The accounts below zero with billed batches open: those filed as overdrawn, once every account is."""
        if not await self._is_marked(OVERDRAWN_INDEXED_KEY):
            return [account for account in await self.list_accounts() if account.overdrawn]
        ids = [filed.root for filed in decoded_all(Filed, await latest_values(self.kv, OVERDRAWN), "overdrawn")]
        accounts = await asyncio.gather(*(self.get_account(account_id) for account_id in ids))
        return [account for account in accounts if account is not None and account.overdrawn]

    async def index_overdrawn(self) -> int:
        """File every overdrawn account; how many accounts were read."""
        accounts = await self.list_accounts()
        for account in accounts:
            await self._file_overdrawn(account)
        return len(accounts)

    async def _file_overdrawn(self, account: AccountRecord) -> None:
        if not KV_TOKEN.fullmatch(account.account_id):
            return  # never filed
        if self._overdrawn.get(account.account_id) == account.overdrawn:
            self._overdrawn.move_to_end(account.account_id)
            return
        key = overdrawn_key(account.account_id)
        if account.overdrawn:
            await self.kv.put(key, Filed(account.account_id).model_dump_json().encode())
        elif account.account_id in self._overdrawn or await read_latest(self.kv, key) is not None:
            await erase(self.kv, key)  # no delete marker: the sweep's scan of `overdrawn.>` would read it for ever
        self._overdrawn[account.account_id] = account.overdrawn
        if len(self._overdrawn) > INDEXED_KEPT:
            self._overdrawn.popitem(last=False)

    async def list_files(self) -> list[FileRecord]:
        return await self._scan("file", FileRecord)

    async def put(self, key: str, record: BaseModel) -> None:
        """The one write: a record at the key the ledger's projection names. A batch is first filed in its owner's
        index and live list, a file in its owner's stored bytes and index: once the record is readable by id, the
        owner's checks and lists see it too."""
        value = record.model_dump_json().encode()
        if isinstance(record, BatchRecord):
            await self._mark_live(record, record.batch.status not in TERMINAL)
        if isinstance(record, FileRecord):
            await self._stored.enter(record)
            copy_key, kept = owner_copy(record)
            await (self.kv.put(copy_key, value) if kept else self.kv.delete(copy_key))
        if isinstance(record, AccountRecord):
            await self._file_overdrawn(record)
        await self._file_under_holders(key, record)
        await self.kv.put(key, value)

    async def _mark_live(self, record: BatchRecord, live: bool) -> None:
        """File the batch in its owner's index unless it is there, then add or remove it in their live list; each
        written only when it changes (the list twice in a batch's life)."""
        owner, batch_id = record.owner, record.batch.id
        async with self._live_locks.hold(owner):
            listed = self._live.get(owner)
            if listed is None:
                listed = await self._live_list(owner)
            await self._file(record, listed)
            ids = with_entry(listed or {}, batch_id, record.batch.input_file_id if live else None)
            if listed is None or ids != listed:
                await self.kv.put(owner_live_key(owner), LiveBatches(ids).model_dump_json().encode())
            if ids:
                self._live[owner] = ids
            else:
                self._live.pop(owner, None)

    async def _file(self, record: BatchRecord, listed: dict[str, str] | None) -> None:
        """The batch's entry in its owner's index, written unless known there (on the live list, or remembered once
        the batch ended)."""
        copy_key, _ = owner_copy(record)
        if copy_key in self._indexed:
            self._indexed.move_to_end(copy_key)
        elif listed is None or record.batch.id not in listed:
            await self.kv.put(copy_key, owner_entry(record).model_dump_json().encode())
        if record.batch.status in TERMINAL:
            self._indexed[copy_key] = None
            if len(self._indexed) > INDEXED_KEPT:
                self._indexed.popitem(last=False)

    async def index_live_batches(self) -> int:
        """Write every owner's live list (once, for a read model made before them); how many owners have batches."""
        lists = live_lists(await self.list_batches())
        for owner, ids in lists.items():
            async with self._live_locks.hold(owner):
                await self.kv.put(owner_live_key(owner), ids.model_dump_json().encode())
                self._live[owner] = dict(ids.root)
        return len(lists)

    async def wait_for(self, fetch: Callable[[], Awaitable[Record | None]], ready: Callable[[Record], bool],
                       timeout_s: float) -> Record | None:
        """Poll until the ledger has folded a fact we just published (read-your-writes); a gateway's creates wait for
        the ledger's notice instead (services/gateway/adapters/fold_notices.py)."""
        deadline = time.monotonic() + timeout_s
        delay = 0.01
        while True:
            record = await fetch()
            if (record is not None and ready(record)) or time.monotonic() > deadline:
                return record
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.2)
