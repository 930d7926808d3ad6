"""The engines an executor serves: the first model is loaded at start, the others on first use.

A small host need not hold every catalogue model at once; the advert tells servable from loaded, so the
scheduler prefers executors that already have a batch's model warm.
"""

import asyncio

from contracts.catalogue import CatalogueModel
from contracts.events.executor import EngineName
from services.executor.adapters.engines import create_engine
from services.executor.adapters.engines.base import Engine


class EngineShelf:
    def __init__(self, engine: EngineName, n_threads: int, models: list[CatalogueModel]) -> None:
        self.engine = engine
        self.n_threads = n_threads
        self.models = {model.id: model for model in models}
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
                engine = create_engine(self.engine, self.n_threads)
                await asyncio.to_thread(engine.load, model)
                self.loaded[model_id] = engine
        return self.loaded[model_id]

    async def preload(self, model_ids: list[str]) -> None:
        for model_id in model_ids:
            await self.get(model_id)

    async def unload_all(self) -> None:
        for engine in self.loaded.values():
            await asyncio.to_thread(engine.unload)
        self.loaded.clear()
