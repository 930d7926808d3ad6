"""The probe `sheshnag up` writes to its object store after a full disk tells the three answers apart on a real
SeaweedFS: a write taken, a write refused (the store answered, and a restart may be due), and no store there at all
(the supervisor's to restart); and it writes into every one of the filer's entry stores (one that met the full disk
can go on refusing alone)."""

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import urllib3
from minio.error import MinioException

from infra.embedded import S3Credentials, free_port, start_seaweed, stop_process
from infra.object_store_watch import FILER_PARTITIONS, ObjectStoreWatch, probe_client
from services.runtime.storage.objectstore import ObjectStore
from tests.conftest import RunningS3


@pytest.fixture
def bucket(object_store: ObjectStore) -> str:
    return object_store.bucket  # made by the session's fixture


@contextlib.contextmanager
def probing(tmp_path: Path, endpoint: str, access_key: str, secret_key: str, bucket: str) -> Iterator[ObjectStoreWatch]:
    made = ObjectStoreWatch(tmp_path, probe_client(endpoint, access_key, secret_key), bucket)
    try:
        yield made
    finally:
        made.close()


async def test_a_write_the_store_takes_is_written(tmp_path: Path, s3_server: RunningS3, bucket: str) -> None:
    with probing(tmp_path, s3_server.endpoint, s3_server.credentials.access_key,
                 s3_server.credentials.secret_key, bucket) as watch:
        assert await watch._probe() == "written"


async def test_a_write_the_store_answers_with_an_error_is_refused(tmp_path: Path, s3_server: RunningS3,
                                                                  bucket: str) -> None:
    with probing(tmp_path, s3_server.endpoint, s3_server.credentials.access_key, "not-the-secret", bucket) as watch:
        assert await watch._probe() == "refused"


async def test_a_store_that_is_not_there_is_unreachable(tmp_path: Path, bucket: str) -> None:
    with probing(tmp_path, f"127.0.0.1:{free_port()}", "key", "secret", bucket) as watch:
        assert await watch._probe() == "unreachable"


def partition_bytes(partition: Path) -> int:
    return sum(path.stat().st_size for path in partition.iterdir() if path.is_file())


def test_a_probe_writes_into_every_partition_of_the_filers_entries(tmp_path: Path) -> None:
    credentials = S3Credentials.load_or_create(tmp_path / "s3-credentials.json")
    port = free_port()
    server = start_seaweed(tmp_path, port, credentials, tmp_path / "weed.log")
    try:
        client = probe_client(f"127.0.0.1:{port}", credentials.access_key, credentials.secret_key)
        for _ in range(50):  # the S3 port listens a moment before the filer behind it answers
            with contextlib.suppress(MinioException, urllib3.exceptions.HTTPError):
                client.make_bucket("probed")
                break
            time.sleep(0.2)
        partitions = sorted(tmp_path.glob("**/filerldb2/0*"))
        assert len(partitions) == FILER_PARTITIONS
        before = {partition: partition_bytes(partition) for partition in partitions}
        with probing(tmp_path, f"127.0.0.1:{port}", credentials.access_key, credentials.secret_key,
                     "probed") as watch:
            assert watch._write_probe() == "written"
        assert [p.name for p in partitions if partition_bytes(p) <= before[p]] == []  # each store took a write
    finally:
        stop_process(server)
