"""A StreamingUpload given up at `finish` removes the object only when its key is its own (a fresh, unique key): under a
key written again (the ledger's archived batch logs, segments and snapshots, a validator's error file, a pushed
model), the object stored before stays."""

import pytest
from minio.error import S3Error

from services.runtime.storage.objectstore import StreamingUpload


class FailingStore:
    """A store whose PUT fails once; `objects` is what it holds."""

    def __init__(self) -> None:
        self.objects = {"archive/batch-log": b"facts 1..N, purged from the stream"}
        self.bucket, self.client = "b", None

    async def put_bytes(self, key: str, data: bytes, content_type: str) -> None:
        raise S3Error("SlowDown", "try again", "", "", "", None)  # type: ignore[arg-type]

    async def remove(self, key: str) -> None:
        self.objects.pop(key, None)


async def test_a_rewrite_given_up_at_finish_keeps_the_object_stored_before() -> None:
    store = FailingStore()
    upload = StreamingUpload(store, "archive/batch-log", "application/gzip")  # type: ignore[arg-type]
    await upload.write(b"facts 1..N+1")
    with pytest.raises(S3Error):
        await upload.finish()
    await upload.abort()
    assert store.objects == {"archive/batch-log": b"facts 1..N, purged from the stream"}


async def test_an_upload_under_its_own_key_given_up_at_finish_is_removed() -> None:
    store = FailingStore()
    store.objects["files/file-1"] = b"half"
    upload = StreamingUpload(store, "files/file-1", "application/jsonl", own_key=True)  # type: ignore[arg-type]
    with pytest.raises(S3Error):
        await upload.finish()
    await upload.abort()
    assert "files/file-1" not in store.objects
