"""Object access for executors, who hold no S3 credentials: a request for presigned URLs and the broker's answer.

Sent on `object_requests(<executor id>)`, a subject only that executor may publish to, so it names who asks.
"""

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from contracts.subjects import parse_result_chunk_key

ObjectOperation = Literal["get", "put", "list"]
"""Read one object, write one object, or list the objects under a prefix (with a read URL for each)."""

LIST_PAGE = 50
"""Objects per list answer: a page of keys and their URLs stays well under 64 KiB."""

AHEAD = 16
"""Objects asked for ahead in one request at most: their URLs stay well under 64 KiB."""

MAX_CHUNK_BYTES = 64 * 1024 * 1024
"""A result chunk past this is not read back (its lines would go to the error file as never run)."""
CHUNK_BYTES = MAX_CHUNK_BYTES // 4
"""An executor commits its pending lines as a chunk once their output lines pass this, whatever their number: far
below `MAX_CHUNK_BYTES` with the chunk lines' own framing (long completions with log-probabilities are large)."""


MAX_KEY_CHARS = 1024
"""The longest object key asked for (S3's own limit is 1,024 bytes): each is signed into a URL of up to 9 bytes per
character, and the answer, with `AHEAD` more, must stay far within the broker's 1 MiB payload (a longer key made an
answer the broker refused: a traceback in the scheduler, no answer)."""
ObjectKey = Annotated[str, Field(max_length=MAX_KEY_CHARS)]


class WantedObject(BaseModel):
    """An object the executor will get or put soon, in the same batch's work (and attempt) as the request."""

    model_config = ConfigDict(frozen=True)

    operation: Literal["get", "put"]
    key: ObjectKey


class ObjectRequest(BaseModel):
    model_config = ConfigDict(frozen=True)

    operation: ObjectOperation
    batch_id: str
    """The batch whose work this is; the object must belong to it."""
    key: ObjectKey
    """The object to read or write, or (list) the prefix whose objects are listed."""
    attempt: int = 0
    """The attempt whose result chunk is written (put of a chunk); 0 for every other request."""
    start_after: ObjectKey = ""
    """List: the last key of the previous page; empty for the first page."""
    ahead: list[WantedObject] = Field(default=[], max_length=AHEAD)
    """A get or put: more objects of the same batch and attempt, asked for at once. Each is judged as if asked
    alone, and only those allowed are granted (`ObjectGrant.ahead`)."""


class SignedObject(BaseModel):
    key: str
    url: str
    """A presigned GET of `key`."""


class GrantedObject(WantedObject):
    url: str
    """The presigned URL of the get or put."""


class ObjectGrant(BaseModel):
    """The broker's answer: URLs for what was asked, or why not."""

    granted: bool
    reason: str | None = None
    """Why the request was refused (or cannot be judged yet)."""
    retry: bool = False
    """Not refused: the broker cannot judge yet (a new leader still reading the log); ask again shortly."""
    url: str | None = None
    """The presigned URL of a get or put."""
    objects: list[SignedObject] = []
    """List: the page of objects under the prefix, in key order."""
    next_after: str | None = None
    """List: more objects follow; ask again with this as `start_after`."""
    expires_in_s: int = 0
    """How long every URL of the answer stays valid."""
    ahead: list[GrantedObject] = []
    """The objects asked for ahead that the executor may get or put, in the order asked."""


def chunk_attempt(key: str) -> tuple[str, int] | None:
    """(batch id, attempt) of a result chunk key (`results/<batch>/attempt-<N>/chunk-<n>.jsonl`), else None."""
    parsed = parse_result_chunk_key(key)
    return (parsed[0], parsed[1]) if parsed else None
