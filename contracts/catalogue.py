"""The model catalogue: catalogue ids and aliases mapped to an engine, an artifact and limits."""

import tomllib

from pydantic import BaseModel, Field

from contracts.events.executor import EngineName


class CatalogueModel(BaseModel):
    id: str
    aliases: list[str] = Field(default_factory=list)
    engine: EngineName
    artifact: str
    """`package:<dist-module>/<path>` for a file inside an installed package, or a filesystem path."""
    context_length: int
    slots: int = 8
    """Parallel sequences the engine runs; the context is split evenly across them."""
    memory_bytes: int
    """Weights plus KV cache at `context_length` and `slots`."""
    endpoints: list[str]
    batchable: bool = True
    owned_by: str = "sheshnag"
    created: int = 0


class Catalogue(BaseModel):
    models: list[CatalogueModel]

    def resolve(self, name: str) -> CatalogueModel | None:
        """The model a request names, by catalogue id or alias."""
        for model in self.models:
            if name == model.id or name in model.aliases:
                return model
        return None

    def restricted_to(self, allowed: list[str] | None) -> "Catalogue":
        """The part of the catalogue a user may use (all of it when `allowed` is None); aliases follow their model."""
        if allowed is None:
            return self
        return Catalogue(models=[model for model in self.models if model.id in allowed])

    @classmethod
    def from_toml(cls, text: str) -> "Catalogue":
        return cls.model_validate(tomllib.loads(text))
