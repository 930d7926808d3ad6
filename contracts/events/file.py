"""Facts about files: uploads by users and output files written by executors."""

from typing import ClassVar, Literal

from contracts.api.file import FilePurpose
from contracts.billing import FileDemand
from contracts.events.envelope import Event


class FileStored(Event):
    """A file's bytes are in the object store under `object_key` and it is visible to its owner."""

    kind: ClassVar = "file"
    name: ClassVar = "stored"
    correlated_by: ClassVar = "batch_id"
    type: Literal["file.stored"] = "file.stored"
    owner_key_id: str
    filename: str
    purpose: FilePurpose
    bytes: int
    sha256: str
    object_key: str
    created_at: int
    """Seconds since the epoch, as the API shows it."""
    line_count: int | None = None
    expires_at: int | None = None
    """Seconds since the epoch after which the file is swept; None keeps it until deleted."""
    batch_id: str | None = None
    """The batch whose output or error file this is (its owner owns the file); None for an upload."""
    model: str | None = None
    """The model named at upload (`x-litellm-model` header or `?model=`): what the lines of a batch on this file
    that name no model run on. None: not named."""
    demand: FileDemand | None = None
    """An upload's worst case, summed as it streamed by: what a billed batch on it reserves. None for result
    files, and uploads from before it."""


class FileDeleted(Event):
    kind: ClassVar = "file"
    name: ClassVar = "deleted"
    type: Literal["file.deleted"] = "file.deleted"
    owner_key_id: str


class FileUsed(Event):
    """A batch is being created on this file. The gateway publishes it before the batch's own fact, fenced on the
    file having no `deleted` fact, and a delete is fenced on the file's last `used` fact: a create and a delete of
    the same file cannot both win."""

    kind: ClassVar = "file"
    name: ClassVar = "used"
    dedup_fields: ClassVar = ("batch_id",)
    correlated_by: ClassVar = "batch_id"
    type: Literal["file.used"] = "file.used"
    batch_id: str
