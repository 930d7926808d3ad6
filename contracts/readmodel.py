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
