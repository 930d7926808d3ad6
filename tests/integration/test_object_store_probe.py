"""The probe `sheshnag up` writes to its object store after a full disk tells the three answers apart on a real
SeaweedFS: a write taken, a write refused (the store answered, and a restart may be due), and no store there at all
(the supervisor's to restart)."""

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.embedded import free_port
from infra.object_store_watch import ObjectStoreWatch, probe_client
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
