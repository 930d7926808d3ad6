"""Where the ledger's archive of the event log lies in the object store, and how one archived fact is written.

The ledger writes it (`services/ledger/archive.py`); the gateway reads an archived batch's log from it.
"""

import base64

import orjson
from pydantic import BaseModel

ARCHIVE_PREFIX = "ledger-archive/"
SEGMENTS_PREFIX = f"{ARCHIVE_PREFIX}segments/"
SNAPSHOTS_PREFIX = f"{ARCHIVE_PREFIX}snapshots/"
BATCH_LOGS_PREFIX = f"{ARCHIVE_PREFIX}batches/"


ARCHIVED_THROUGH_KEY = "ledger.archived"
"""The read model's key of `ArchivedThrough`: how a ledger with an empty store learns that the stream was trimmed."""


class ArchivedThrough(BaseModel):
    """The newest archived point: facts up to `last_sequence` may have left the stream (they are in the archive)."""

    index: int
    """The point's segment and snapshot index."""
    last_sequence: int


def segment_key(index: int) -> str:
    """The `index`-th segment of the log (from 1): every fact of one period, gzipped JSONL."""
    return f"{SEGMENTS_PREFIX}{index:08d}.jsonl.gz"


def snapshot_key(index: int) -> str:
    """The ledger's state through the last fact of segment `index`: its commit point."""
    return f"{SNAPSHOTS_PREFIX}{index:08d}.jsonl.gz"


def index_of(key: str) -> int:
    """The index a segment's or snapshot's key names."""
    return int(key.rsplit("/", 1)[-1].split(".", 1)[0])


def archived_batch_log_key(batch_id: str) -> str:
    """The log of one batch whose facts were purged from the stream: its facts in stream order, gzipped JSONL."""
    return f"{BATCH_LOGS_PREFIX}{batch_id}.jsonl.gz"


def fact_line(sequence: int, subject: str, data: bytes) -> bytes:
    """One archived fact as a JSONL line: the payload's exact bytes survive (as text when UTF-8, else base64)."""
    try:
        body: dict[str, object] = {"sequence": sequence, "subject": subject, "data": data.decode()}
    except UnicodeDecodeError:
        body = {"sequence": sequence, "subject": subject, "data_b64": base64.b64encode(data).decode()}
    return orjson.dumps(body) + b"\n"


def parse_fact_line(line: bytes) -> tuple[int, str, bytes]:
    """`fact_line`'s inverse: sequence, subject and the payload's bytes."""
    body = orjson.loads(line)
    data = body["data"].encode() if "data" in body else base64.b64decode(body["data_b64"])
    return int(body["sequence"]), str(body["subject"]), data
