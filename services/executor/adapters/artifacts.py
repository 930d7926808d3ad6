"""Catalogue artifacts as local files an engine loads: a package resource or path as it is; a model object downloaded
once into a cache named by SHA-256, renamed into place only once its hash matches (so the cache holds verified files);
a Hugging Face file or checkpoint through huggingface_hub's own cache."""

import asyncio
import contextlib
import hashlib
import logging
import os
import tempfile
import time
from pathlib import Path, PurePosixPath
from typing import IO

import urllib3
from minio.error import S3Error

from contracts.catalogue import CatalogueModel, HubFile, ModelObject, hub_artifact, hub_checkpoint, object_artifact
from services.executor.adapters.objects import ObjectAccess
from services.runtime.storage.catalogue import install_command, resolve_artifact
from services.runtime.storage.hub import CheckpointUnavailable, checkpoint_directory
from services.runtime.storage.objectstore import ObjectNotFound, close_stream

log = logging.getLogger(__name__)

VERIFIED_DIR = "sha256"
PARTIAL_DIR = "partial"
STALE_PARTIAL_S = 3600.0
"""A partial download untouched this long was left by a process that died: it is removed."""


class ArtifactUnavailable(RuntimeError):
    """The artifact cannot be had as a local file (no object access yet, no such object, a refusal, no hub)."""


class ArtifactMismatch(ArtifactUnavailable):
    """The artifact's bytes do not hash to the catalogue's pinned SHA-256: they are refused, never loaded."""


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sheshnag" / "models"


class ArtifactResolver:
    """`objects`: the executor's object access, once it has one; until then only cached model objects are found."""

    def __init__(self, cache_dir: Path, objects: ObjectAccess | None = None,
                 hub_cache_dir: Path | None = None) -> None:
        self.cache_dir = cache_dir
        self.objects = objects
        self.hub_cache_dir = hub_cache_dir
        """huggingface_hub's cache; None: its own default (`HF_HOME`, `HF_HUB_CACHE`)."""
        self._fetching: dict[str, asyncio.Lock] = {}
        self._verified: set[tuple[Path, str]] = set()
        """Local files (package, path, hub) already hashed by this process against their pin."""

    async def local_path(self, model: CatalogueModel) -> Path:
        """The file to load `model` from, fetched and verified first if need be."""
        model_object = object_artifact(model.artifact)
        if model_object is not None:
            return await self._cached_object(model, model_object)
        checkpoint = hub_checkpoint(model.artifact)
        if checkpoint is not None:  # a directory, pinned by its revision (no sha256)
            try:
                return await asyncio.to_thread(checkpoint_directory, checkpoint, self.hub_cache_dir)
            except CheckpointUnavailable as error:
                raise ArtifactUnavailable(f"{model.id}: {error}") from error
        hub_file = hub_artifact(model.artifact)
        if hub_file is not None:
            path = await asyncio.to_thread(hub_download, model.artifact, hub_file, self.hub_cache_dir)
        else:
            try:
                path = resolve_artifact(model.artifact)
            except FileNotFoundError as missing:
                raise FileNotFoundError(f"{model.id}'s weights are not installed on this host ({missing}): "
                                        f"{install_command(model)}") from missing
        if model.sha256 is not None and (path, model.sha256) not in self._verified:
            actual = await asyncio.to_thread(sha256_of, path)
            if actual != model.sha256:
                raise ArtifactMismatch(mismatch(model, model.sha256, actual, path.stat().st_size))
            self._verified.add((path, model.sha256))
        return path

    def at_hand(self, model: CatalogueModel) -> bool:
        """Whether `local_path` can answer without the object store: any form but a model object not cached yet."""
        model_object = object_artifact(model.artifact)
        if model_object is None or self.objects is not None or model.sha256 is None:
            return True
        return self.cached_path(model.sha256, model_object.key).is_file()

    def cached_path(self, sha256: str, key: str) -> Path:
        """Where a verified object lives: under its hash (shared by models sharing weights), with its own file name."""
        return self.cache_dir / VERIFIED_DIR / sha256 / PurePosixPath(key).name

    async def _cached_object(self, model: CatalogueModel, model_object: ModelObject) -> Path:
        assert model.sha256 is not None, "the catalogue requires a pinned sha256 for an s3 artifact"
        target = self.cached_path(model.sha256, model_object.key)
        async with self._fetching.setdefault(model.sha256, asyncio.Lock()):
            if not await asyncio.to_thread(target.is_file):
                if self.objects is None:
                    raise ArtifactUnavailable(f"{model.artifact} ({model.id}) is fetched from the deployment's "
                                              "object store, which this executor has not reached yet")
                await self._download(model, model_object.key, target)
        return target

    async def _download(self, model: CatalogueModel, key: str, target: Path) -> None:
        assert model.sha256 is not None
        handle = await asyncio.to_thread(_open_partial, self.cache_dir / PARTIAL_DIR, model.sha256[:16])
        partial = Path(handle.name)
        log.info("fetching %s (%s) into %s", model.artifact, model.id, target)
        try:
            actual, size = await self._fetch(model, key, handle)
            await asyncio.to_thread(_seal, handle)
            if actual != model.sha256:
                raise ArtifactMismatch(mismatch(model, model.sha256, actual, size))
            await asyncio.to_thread(target.parent.mkdir, parents=True, exist_ok=True)
            await asyncio.to_thread(os.replace, partial, target)
        except BaseException:
            _discard(handle, partial)  # inline, not in a thread: a cancelled download leaves no partial file
            raise
        log.info("fetched %s: %d bytes, sha256 verified", model.artifact, size)

    async def _fetch(self, model: CatalogueModel, key: str, handle: IO[bytes]) -> tuple[str, int]:
        """The object streamed into `handle` chunk by chunk (each written off the loop): its SHA-256 and size."""
        assert self.objects is not None
        digest = hashlib.sha256()
        size = 0
        chunks = self.objects.iter_chunks(key)
        try:
            async for chunk in chunks:
                size += len(chunk)
                if size > model.memory_bytes:
                    raise ArtifactUnavailable(f"{model.artifact} is larger than {model.id}'s whole memory need "
                                              f"({model.memory_bytes} bytes): it cannot be its weights")
                await asyncio.to_thread(_append, handle, digest, chunk)
        except ObjectNotFound as error:
            raise ArtifactUnavailable(f"{model.artifact} ({model.id}): no such object in the deployment's "
                                      "object store") from error
        except (S3Error, urllib3.exceptions.HTTPError, OSError) as error:
            raise ArtifactUnavailable(f"{model.artifact} ({model.id}) could not be fetched: {error}") from error
        finally:
            await close_stream(chunks)
        return digest.hexdigest(), size


def mismatch(model: CatalogueModel, expected: str, actual: str, size: int) -> str:
    return (f"{model.artifact} ({model.id}) is refused: the catalogue pins sha256 {expected}, but its {size} bytes "
            f"hash to {actual}")


def hub_download(artifact: str, hub_file: HubFile, cache_dir: Path | None) -> Path:
    """The file from huggingface_hub's cache, fetched into it first when the hub answers; blocking."""
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError
    except ImportError as error:
        raise ArtifactUnavailable(f"{artifact} needs huggingface_hub (pip install huggingface_hub)") from error
    try:
        return Path(hf_hub_download(hub_file.repo, hub_file.filename, revision=hub_file.revision,
                                    cache_dir=cache_dir))
    except (OSError, ValueError, EntryNotFoundError) as error:
        raise ArtifactUnavailable(f"{artifact}: not in the Hugging Face cache, and the hub did not serve it "
                                  f"({type(error).__name__}: {error})") from error


def sha256_of(path: Path) -> str:
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def _append(handle: IO[bytes], digest: "hashlib._Hash", chunk: bytes) -> None:
    handle.write(chunk)
    digest.update(chunk)


def _seal(handle: IO[bytes]) -> None:
    """On disk before it is renamed into place: a crash then leaves a whole file or none."""
    handle.flush()
    os.fsync(handle.fileno())
    handle.close()


def _discard(handle: IO[bytes], partial: Path) -> None:
    handle.close()
    partial.unlink(missing_ok=True)


def _open_partial(partial_dir: Path, prefix: str) -> IO[bytes]:
    """A new file to download into, beside the cache (so the rename is atomic), dead processes' partial files gone."""
    partial_dir.mkdir(parents=True, exist_ok=True)
    now = time.time()
    for stale in partial_dir.glob(f"{prefix}*"):
        with contextlib.suppress(FileNotFoundError):
            if now - stale.stat().st_mtime > STALE_PARTIAL_S:
                stale.unlink()
    return tempfile.NamedTemporaryFile(dir=partial_dir, prefix=prefix, delete=False)
