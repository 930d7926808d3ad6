"""Which executors can take a model: live, serving it, and with it loaded or the memory to load it."""

from collections.abc import Iterable

from contracts.catalogue import CatalogueModel
from contracts.events.executor import ExecutorAdvert

HEARTBEAT_FRESH_MS = 15_000


def is_alive(advert: ExecutorAdvert, now_ms: int) -> bool:
    return now_ms - advert.heartbeat_at <= HEARTBEAT_FRESH_MS


def free_bytes(advert: ExecutorAdvert) -> int:
    return max((device.free_bytes for device in advert.devices), default=0)


def why_unassignable(model: CatalogueModel, adverts: Iterable[ExecutorAdvert], now_ms: int) -> str:
    live = [a for a in adverts if is_alive(a, now_ms)]
    serving = [a for a in live if model.id in a.models]
    if not live:
        return "No executor is online."
    if not serving:
        return f"No online executor serves {model.id}."
    return f"No executor serving {model.id} has {model.memory_bytes} bytes free."


def eligible_executors(model: CatalogueModel, adverts: Iterable[ExecutorAdvert], now_ms: int) -> list[ExecutorAdvert]:
    """Live executors that serve `model` and have it loaded or the memory to load it."""
    return [advert for advert in adverts if model.id in advert.models and is_alive(advert, now_ms)
            and (model.id in advert.loaded_models or free_bytes(advert) >= model.memory_bytes)]
