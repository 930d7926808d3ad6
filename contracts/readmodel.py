"""Records the ledger materialises for the gateway to read: the API object plus private fields."""

from typing import Literal, get_args

from pydantic import BaseModel, Field, RootModel

from contracts.api.batch import Batch
from contracts.api.file import FileObject
from contracts.api.organization import DEFAULT_ORGANIZATION_ID
from contracts.billing import FileDemand
from contracts.events.executor import EngineName
from contracts.events.key import KeyRole, MemberRole
from contracts.ids import owner_id


class BatchRecord(BaseModel):
    owner_key_id: str
    owner_user_id: str | None = None
    """The user of the key that created it; None: a key without a user owns it alone (and records made before)."""
    batch: Batch
    last_sequence: int
    """Stream sequence of the last event folded into this record."""

    @property
    def owner(self) -> str:
        return owner_id(self.owner_user_id, self.owner_key_id)


class LiveBatches(RootModel[dict[str, str]]):
    """An owner's batches that have not ended, each id with its input file's, by id (`owner_live_key`): limits,
    twin and in-use checks read these, not every batch the owner ever had."""


class StoredFiles(RootModel[dict[str, tuple[int, int | None, str]]]):
    """One part of an owner's files that are not deleted (those whose SHA-256 starts with the part's two hex digits),
    each id with its bytes, expiry and SHA-256 (`owner_stored_part_key`): a same-upload check reads one part."""


class StoredBytes(RootModel[dict[str, tuple[int, int | None]]]):
    """An owner's stored bytes by part (`owner_stored_key`): each non-empty part's bytes and its earliest expiry, so
    a quota check reads this alone (and a part only while a file in it is expired and not swept yet)."""


class FileRecord(BaseModel):
    owner_key_id: str
    owner_user_id: str | None = None
    """The user of the key that stored it (output files: of the batch's key); None: the key alone owns it."""
    object_key: str
    sha256: str
    deleted: bool = False
    model: str | None = None
    """The model named at upload, for lines that name none (`FileStored.model`)."""
    demand: FileDemand | None = None
    """The upload's worst case (`FileStored.demand`); None for result files and older uploads."""
    file: FileObject

    @property
    def owner(self) -> str:
        return owner_id(self.owner_user_id, self.owner_key_id)


class ApiKeyRecord(BaseModel):
    key_id: str
    role: KeyRole
    label: str
    user_id: str | None = None
    """The user the key acts for; None: a key without a user (every model allowed)."""
    provider_id: str | None = None
    """For a worker key: the provider it belongs to; None: an admin's or operator's worker key."""
    revoked: bool = False
    created_at: int | None = None
    """Seconds since the epoch."""

    @property
    def owner(self) -> str:
        """Who owns the files and batches this key creates: its user, or the key itself."""
        return owner_id(self.user_id, self.key_id)

    @property
    def holders(self) -> list[str]:
        """Whose keys this one counts among (each a KV-key token): its user's (`user-…`), its provider's
        (`provider-…`); none for a key of neither (an admin's or an operator's own)."""
        return ([user_holder(self.user_id)] if self.user_id is not None else []) + (
            [provider_holder(self.provider_id)] if self.provider_id is not None else [])


def user_holder(user_id: str) -> str:
    """The holder a user's keys are filed under (their `owner_id`)."""
    return owner_id(user_id, "")


def provider_holder(provider_id: str) -> str:
    """The holder a provider's worker keys are filed under."""
    return f"provider-{provider_id}"


class KeyDigest(RootModel[str]):
    """The SHA-256 of a key, filed under its public id (`key_id_key`)."""


class Filed(RootModel[str]):
    """A record's id filed under its holder, where the record itself is read by its id (one that changes often, an
    executor's, is filed once rather than copied at each change)."""


class HoldersIndexed(RootModel[bool]):
    """The mark that an index is made: every key, provider and executor filed under its holders
    (`HOLDERS_INDEXED_KEY`), every user under its organisation (`MEMBERS_INDEXED_KEY`), every overdrawn account
    (`OVERDRAWN_INDEXED_KEY`)."""


class UserRecord(BaseModel):
    user_id: str
    display_name: str
    allowed_models: list[str] | None = None
    """Catalogue ids the user's keys may use; None: every model."""
    created_at: int
    organization_id: str | None = None
    """None: the default organisation."""
    role: MemberRole = "member"
    """`admin`: an administrator of the organisation (lists and cancels its members' batches)."""

    @property
    def organization(self) -> str:
        """The organisation the user belongs to (also their billing account): none named is the default's."""
        return self.organization_id or DEFAULT_ORGANIZATION_ID


class OrganizationRecord(BaseModel):
    organization_id: str
    display_name: str
    created_at: int


class AccountMovement(BaseModel):
    """One movement of an account's credit."""

    type: Literal["grant", "reservation", "debit", "refund", "release"]
    amount_micros: int
    batch_id: str | None = None
    endpoint: str | None = None
    """For a batch's movements, its endpoint marked `:batch` (e.g. `/v1/chat/completions:batch`)."""
    at: int
    """Seconds since the epoch."""
    sequence: int
    """The stream sequence of the fact that moved it."""


class AccountRecord(BaseModel):
    """An organisation's credit, in micro-USD."""

    account_id: str
    balance_micros: int
    """Granted less debited."""
    reserved_micros: int
    """Held for batches not ended yet, less what they were debited already."""
    granted_micros: int = 0
    debited_micros: int = 0
    open_batches: int = 0
    open_batch_ids: list[str] = Field(default_factory=list)
    """Batches whose reservation is open (billed batches not ended yet)."""
    last_event: AccountMovement | None = None
    credit_sequence: int = 0
    """Stream sequence of the account's last grant, reservation or release: a new reservation is published on the
    condition that none came after it (so two creates never spend the same credit)."""
    last_sequence: int

    @property
    def available_micros(self) -> int:
        return self.balance_micros - self.reserved_micros

    @property
    def overdrawn(self) -> bool:
        """Below zero with billed batches still open: the credit sweep stops them."""
        return self.balance_micros < 0 and bool(self.open_batch_ids)


class ProviderRecord(BaseModel):
    provider_id: str
    display_name: str
    owner_key_id: str
    owner_user_id: str | None = None
    """Every key of this user may manage the provider; None: only `owner_key_id` may."""
    created_at: int
    """Seconds since the epoch."""
    approved_platform_wide: bool = False
    """A platform admin approved it: it may run every organisation's batches that allow approved providers."""
    approved_organizations: list[str] = Field(default_factory=list)
    """Organisations (public ids) whose administrators approved it for their batches."""

    @property
    def owner(self) -> str:
        return owner_id(self.owner_user_id, self.owner_key_id)


class ExecutorRecord(BaseModel):
    """What the log says of an executor; its live state (models loaded, memory) is in its heartbeat."""

    executor_id: str
    engine: EngineName
    engine_version: str
    models: list[str]
    """Catalogue ids it could serve when it last registered."""
    worker_key_id: str | None = None
    provider_id: str | None = None
    """The provider whose worker key it last joined with (None: an admin's or operator's worker key)."""
    status: Literal["online", "lost"]
    started_at: int
    """Milliseconds since the epoch: when its process last started."""
    last_heartbeat_at: int | None = None
    """Milliseconds since the epoch, as of its loss; None while it was never lost."""
    lines_served: int = 0
    """Lines (completed or failed) that attempts it ran made durable."""


AnomalyKind = Literal["batch", "file", "key", "user", "executor", "provider", "organization", "account"]
ANOMALY_KINDS: frozenset[str] = frozenset(get_args(AnomalyKind))


class AnomalyRecord(BaseModel):
    """A fact the ledger refused because it did not fit its aggregate (illegal transition, duplicate creation)."""

    sequence: int
    """Stream sequence of the refused fact."""
    aggregate_kind: AnomalyKind
    aggregate_id: str
    event_type: str
    reason: str
    occurred_at: int
    """Seconds since the epoch: when the refused fact happened."""
