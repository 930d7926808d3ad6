"""Why no executor can take a model: none online, none serving it, or none with the memory."""

from contracts.catalogue import CatalogueModel
from contracts.events.executor import DeviceMemory, ExecutorAdvert
from services.scheduler.domain import why_unassignable

NOW = 1_000_000
MODEL = CatalogueModel(id="m", engine="llamacpp", artifact="/x.gguf", context_length=2048,
                       memory_bytes=1_000, endpoints=["/v1/chat/completions"])


def advert(executor_id: str, free: int, loaded: bool = False, models: tuple[str, ...] = ("m",),
           heartbeat_at: int = NOW) -> ExecutorAdvert:
    return ExecutorAdvert(executor_id=executor_id, engine="llamacpp", engine_version="1", models=list(models),
                          loaded_models=["m"] if loaded else [], slots=8, heartbeat_at=heartbeat_at,
                          devices=[DeviceMemory(name="cpu", total_bytes=10_000, free_bytes=free)])


def test_the_reason_names_the_memory_when_executors_serve_the_model_but_none_has_it() -> None:
    adverts = [advert("small", 500), advert("other", 9_000, models=("n",)), advert("stale", 9_000, heartbeat_at=0)]
    assert "1000 bytes free" in why_unassignable(MODEL, adverts, NOW)


def test_the_reason_says_when_nobody_is_online() -> None:
    assert why_unassignable(MODEL, [], NOW) == "No executor is online."
