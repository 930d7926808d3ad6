"""The object store a deployment runs on (MinIO in a container where Docker runs, SeaweedFS's S3 server here):
uploads streamed in parts, line reads, listings and removal through the services' store, and the URLs the
scheduler signs for executors that hold no S3 credentials."""

import hashlib
import secrets
from collections.abc import AsyncIterator

import pytest
import urllib3

from services.runtime.process.settings import ConnectionSettings
from services.runtime.storage.objectstore import UPLOAD_PART_BYTES, ObjectNotFound, ObjectStore
from services.scheduler.objects import ObjectSigner
from tests.deployment.backends import S3Backend


def connection_to(backend: S3Backend, bucket: str) -> ConnectionSettings:
    return ConnectionSettings(s3_endpoint=backend.endpoint, s3_access_key=backend.access_key,
                              s3_secret_key=backend.secret_key, s3_bucket=bucket)


@pytest.fixture
async def bucket(s3_backend: S3Backend) -> AsyncIterator[ConnectionSettings]:
    """A bucket of the test's own on that server."""
    connection = connection_to(s3_backend, f"deploy-{secrets.token_hex(4)}")
    store = ObjectStore.from_settings(connection)
    await store.ensure_bucket()
    store.close()
    yield connection


async def test_an_upload_streamed_in_parts_reads_back_whole_line_by_line_then_is_removed(
        bucket: ConnectionSettings) -> None:
    store = ObjectStore.from_settings(bucket)
    line = b'{"custom_id": "x", "body": "' + b"a" * 1000 + b'"}\n'
    lines = 2 * UPLOAD_PART_BYTES // len(line) + 3  # more than two parts
    upload = store.writer("files/big.jsonl", "application/jsonl")
    sent = hashlib.sha256()
    for _ in range(lines):
        await upload.write(line)
        sent.update(line)
    await upload.finish()
    try:
        assert hashlib.sha256(await store.get_bytes("files/big.jsonl")).hexdigest() == sent.hexdigest()
        assert sum([1 async for _ in store.iter_lines("files/big.jsonl")]) == lines
        assert await store.list_keys("files/") == ["files/big.jsonl"]
        await store.remove("files/big.jsonl")
        with pytest.raises(ObjectNotFound):
            await store.get_bytes("files/big.jsonl")
    finally:
        store.close()


async def test_a_signed_url_reads_or_writes_its_one_object_for_a_caller_without_credentials(
        bucket: ConnectionSettings) -> None:
    store = ObjectStore.from_settings(bucket)
    signer = ObjectSigner.from_settings(bucket, "", expiry_s=60)
    http = urllib3.PoolManager()
    try:
        await store.put_bytes("batches/b1/input.jsonl", b"line one\n")
        read = http.request("GET", signer.url("GET", "batches/b1/input.jsonl"))
        assert (read.status, read.data) == (200, b"line one\n")

        written = http.request("PUT", signer.url("PUT", "batches/b1/chunks/0001.jsonl"), body=b"result\n")
        assert written.status == 200
        assert await store.get_bytes("batches/b1/chunks/0001.jsonl") == b"result\n"

        # The signature covers the key: the same URL pointed at another object is refused.
        elsewhere = signer.url("GET", "batches/b1/input.jsonl").replace("batches/b1/input.jsonl",
                                                                         "batches/b2/input.jsonl")
        assert http.request("GET", elsewhere).status == 403
        unsigned = f"http://{bucket.s3_endpoint}/{bucket.s3_bucket}/batches/b1/input.jsonl"
        assert http.request("GET", unsigned).status == 403
    finally:
        http.clear()
        store.close()
        signer.store.close()
