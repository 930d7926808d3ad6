"""The engines an executor serves: the first model is loaded at start, the others on first use (the advert tells
servable from loaded, so the scheduler prefers executors with a batch's model warm). Each artifact is made a
verified local file first (artifacts.py)."""

import asyncio
import logging

from contracts.catalogue import CatalogueModel
from contracts.engines import release_at_least
from contracts.events.executor import EngineName
from services.executor.adapters.artifacts import ArtifactResolver, default_cache_dir
from services.executor.adapters.engines import create_engine
from services.executor.adapters.engines.base import Engine
from services.executor.adapters.objects import ObjectAccess

log = logging.getLogger(__name__)


def servable_at_release(release: str, models: list[CatalogueModel]) -> dict[str, CatalogueModel]:
    """The models whose `engine_version` this engine release satisfies: one pinning a later release is left out (the
    validator admits parameters this release would ignore), with a warning; ValueError when none is left."""
    servable = {}
    for model in models:
        if model.engine_version is None or release_at_least(release, model.engine_version):
            servable[model.id] = model
        else:
            log.warning("%s is not served here: its catalogue entry pins engine_version %s, and this engine is %s",
                        model.id, model.engine_version, release)
    if models and not servable:
        raise ValueError(f"no model can be served by this engine release ({release}): "
                         + ", ".join(f"{model.id} needs {model.engine_version}" for model in models))
    return servable


class EngineShelf:
    def __init__(self, engine: EngineName, n_threads: int, models: list[CatalogueModel],
                 artifacts: ArtifactResolver | None = None) -> None:
        self.engine = engine
        self.n_threads = n_threads
        self.models = servable_at_release(create_engine(engine, n_threads).release, models)
        self.artifacts = artifacts or ArtifactResolver(default_cache_dir())
        self.loaded: dict[str, Engine] = {}
        self._loading = asyncio.Lock()

    @property
    def servable(self) -> list[str]:
        return sorted(self.models)

    def loaded_bytes(self) -> int:
        """The catalogue's memory need of every loaded model."""
        return sum(self.models[model_id].memory_bytes for model_id in self.loaded)

    async def get(self, model_id: str) -> Engine | None:
        """The model's engine, loading it first if needed; None for a model this executor does not serve."""
        model = self.models.get(model_id)
        if model is None:
            return None
        async with self._loading:
            if model_id not in self.loaded:
                path = await self.artifacts.local_path(model)
                engine = create_engine(self.engine, self.n_threads)
                # The engine loads the local file; the catalogue entry the shelf advertises keeps its artifact.
                await asyncio.to_thread(engine.load, model.model_copy(update={"artifact": str(path)}))
                self.loaded[model_id] = engine
        return self.loaded[model_id]

    def reach_objects(self, objects: ObjectAccess) -> None:
        """The executor's object access (direct or brokered), once it has one: model objects are fetched with it."""
        self.artifacts.objects = objects

    async def preload(self, model_ids: list[str]) -> None:
        """Load these models now; one whose weights are in the object store not reached yet loads on first use."""
        for model_id in model_ids:
            model = self.models.get(model_id)
            if model is not None and not self.artifacts.at_hand(model):
                log.info("%s loads on first use: its weights are in the object store", model_id)
                continue
            await self.get(model_id)

    async def unload_all(self) -> None:
        for engine in self.loaded.values():
            await asyncio.to_thread(engine.unload)
        self.loaded.clear()
