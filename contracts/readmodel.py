"""Records the ledger materialises for the gateway to read: the API object plus private fields."""

from pydantic import BaseModel

from contracts.api.batch import Batch
from contracts.api.file import FileObject
from contracts.events.key import KeyRole


class BatchRecord(BaseModel):
    owner_key_id: str
    batch: Batch
    last_sequence: int
    """Stream sequence of the last event folded into this record."""


class FileRecord(BaseModel):
    owner_key_id: str
    object_key: str
    sha256: str
    deleted: bool = False
    file: FileObject


class ApiKeyRecord(BaseModel):
    key_id: str
    role: KeyRole
    label: str
    user_id: str | None = None
    """The user the key acts for; None: a key without a user (every model allowed)."""
    revoked: bool = False
    created_at: int | None = None
    """Seconds since the epoch."""


class UserRecord(BaseModel):
    user_id: str
    display_name: str
    allowed_models: list[str] | None = None
    """Catalogue ids the user's keys may use; None: every model."""
    created_at: int
