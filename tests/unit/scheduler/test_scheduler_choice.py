"""Choosing an executor: the model must be served and fit; warm executors and tight fits win."""

from contracts.catalogue import CatalogueModel
from contracts.events.executor import DeviceMemory, ExecutorAdvert
from services.scheduler.domain import choose_executor, why_unassignable

NOW = 1_000_000
MODEL = CatalogueModel(id="m", engine="llamacpp", artifact="/x.gguf", context_length=2048,
                       memory_bytes=1_000, endpoints=["/v1/chat/completions"])


def advert(executor_id: str, free: int, loaded: bool = False, models: tuple[str, ...] = ("m",),
           heartbeat_at: int = NOW) -> ExecutorAdvert:
    return ExecutorAdvert(executor_id=executor_id, engine="llamacpp", engine_version="1", models=list(models),
                          loaded_models=["m"] if loaded else [], slots=8, heartbeat_at=heartbeat_at,
                          devices=[DeviceMemory(name="cpu", total_bytes=10_000, free_bytes=free)])


def test_an_executor_with_the_model_already_loaded_is_preferred() -> None:
    chosen = choose_executor(MODEL, [advert("cold", 9_000), advert("warm", 100, loaded=True)], NOW)
    assert chosen is not None and chosen.executor_id == "warm"


def test_among_cold_executors_the_tightest_fit_wins() -> None:
    chosen = choose_executor(MODEL, [advert("big", 9_000), advert("snug", 1_200)], NOW)
    assert chosen is not None and chosen.executor_id == "snug"


def test_executors_without_memory_the_model_or_a_fresh_heartbeat_are_skipped() -> None:
    adverts = [advert("small", 500), advert("other", 9_000, models=("n",)), advert("stale", 9_000, heartbeat_at=0)]
    assert choose_executor(MODEL, adverts, NOW) is None
    assert "1000 bytes free" in why_unassignable(MODEL, adverts, NOW)


def test_the_reason_says_when_nobody_is_online() -> None:
    assert why_unassignable(MODEL, [], NOW) == "No executor is online."
