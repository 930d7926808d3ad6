"""Choosing an executor for a batch: it must serve the model and have the memory; warm and best fit first."""

from collections.abc import Iterable

from contracts.catalogue import CatalogueModel
from contracts.events.executor import ExecutorAdvert

HEARTBEAT_FRESH_MS = 15_000


def is_alive(advert: ExecutorAdvert, now_ms: int) -> bool:
    return now_ms - advert.heartbeat_at <= HEARTBEAT_FRESH_MS


def free_bytes(advert: ExecutorAdvert) -> int:
    return max((device.free_bytes for device in advert.devices), default=0)


def choose_executor(
    model: CatalogueModel, adverts: Iterable[ExecutorAdvert], now_ms: int
) -> ExecutorAdvert | None:
    """The executor to run a batch of `model` on, or None when no live executor can.

    An executor that already has the model loaded needs no more memory; otherwise the model must fit.
    Among those, warm ones win, then the tightest fit (leaving big devices for big models).
    """
    candidates: list[tuple[bool, int, str, ExecutorAdvert]] = []
    for advert in adverts:
        if model.id not in advert.models or not is_alive(advert, now_ms):
            continue
        warm = model.id in advert.loaded_models
        spare = free_bytes(advert) - (0 if warm else model.memory_bytes)
        if spare < 0:
            continue
        candidates.append((not warm, spare, advert.executor_id, advert))
    if not candidates:
        return None
    return min(candidates, key=lambda c: (c[0], c[1], c[2]))[3]


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
