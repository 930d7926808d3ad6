"""The object store's side of a backup: every object of every bucket copied to files with its SHA-256, and put
back into an empty store, each file checked against its hash before it is sent. Blocking (minio): run in a thread."""

import hashlib
import time
from pathlib import Path, PurePosixPath

import urllib3
from minio import Minio
from minio.error import S3Error
from pydantic import BaseModel

from services.runtime.storage.objectstore import MISSING_OBJECT_CODES

READY_S = 30.0
"""A store just started may refuse calls for a moment."""


class BackedUpObject(BaseModel):
    bucket: str
    key: str
    bytes: int
    sha256: str
    content_type: str = "application/octet-stream"


class ObjectsRefused(RuntimeError):
    """The target store is not empty, or a backed-up file no longer matches its hash."""


def local_path(root: Path, bucket: str, key: str) -> Path:
    """Where an object's copy lies: `objects/<bucket>/<key>`; a key that would lead out of it is refused."""
    parts = PurePosixPath(key).parts
    if not parts or key.startswith("/") or any(part in ("..", ".") for part in parts):
        raise ObjectsRefused(f"object key {key!r} in {bucket} cannot be kept as a file")
    return root / bucket / Path(*parts)


def sha256_of(path: Path) -> str:
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def _buckets(client: Minio) -> list[str]:
    deadline = time.monotonic() + READY_S
    while True:
        try:
            return sorted(bucket.name for bucket in client.list_buckets())
        except (S3Error, urllib3.exceptions.HTTPError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def back_up_objects(client: Minio, root: Path) -> list[BackedUpObject]:
    """Every object of every bucket into `root`; an object removed while the copy runs is skipped."""
    copied: list[BackedUpObject] = []
    for bucket in _buckets(client):
        for listed in client.list_objects(bucket, recursive=True):
            key = listed.object_name
            if not key or key.endswith("/"):
                continue
            path = local_path(root, bucket, key)
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                stat = client.fget_object(bucket, key, str(path))
            except S3Error as error:
                if error.code in MISSING_OBJECT_CODES:
                    continue
                raise
            copied.append(BackedUpObject(bucket=bucket, key=key, bytes=path.stat().st_size, sha256=sha256_of(path),
                                         content_type=stat.content_type or "application/octet-stream"))
    return copied


def check_empty(client: Minio, buckets: set[str]) -> None:
    """Refuse a target whose buckets hold objects already: a restore does not merge."""
    existing = set(_buckets(client)) & buckets
    for bucket in sorted(existing):
        for _ in client.list_objects(bucket, recursive=True):
            raise ObjectsRefused(f"bucket {bucket} is not empty: restore into an empty object store")


def restore_objects(client: Minio, root: Path, objects: list[BackedUpObject]) -> int:
    """Put every backed-up object back; returns how many."""
    made: set[str] = set(_buckets(client))
    for item in objects:
        path = local_path(root, item.bucket, item.key)
        if sha256_of(path) != item.sha256:
            raise ObjectsRefused(f"{path} does not match the SHA-256 the backup recorded for it")
        if item.bucket not in made:
            client.make_bucket(item.bucket)
            made.add(item.bucket)
        client.fput_object(item.bucket, item.key, str(path), content_type=item.content_type)
    return len(objects)
