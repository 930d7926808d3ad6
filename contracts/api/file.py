"""Files as the OpenAI Files API shows them."""

from typing import Literal

from pydantic import BaseModel

FilePurpose = Literal[
    "assistants",
    "assistants_output",
    "batch",
    "batch_output",
    "fine-tune",
    "fine-tune-results",
    "vision",
    "user_data",
]
FileStatus = Literal["uploaded", "processed", "error"]
RESULT_FILE_EXPIRES_AFTER_S = 30 * 24 * 3600
"""A batch's output and error files expire this long after they are written, unless `output_expires_after` says."""
MAX_FILENAME = 255
"""The longest name an upload may give its file, in characters (what most file systems allow a file's name)."""


class FileObject(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    """Size of the stored content."""
    created_at: int
    filename: str
    purpose: FilePurpose
    status: FileStatus = "processed"
    expires_at: int | None = None


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool
