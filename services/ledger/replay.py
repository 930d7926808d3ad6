"""Operator check: refold the whole stream into a scratch (in-memory) ledger and diff it against the live read model."""

import asyncio

import nats.js.errors
from pydantic import BaseModel

from contracts.subjects import EVENTS_STREAM
from services.ledger.application import Ledger, persistence_env
from services.ledger.handlers import Folder, follow
from services.ledger.projection import KeyProjection, Projection, projection_key
from services.runtime.bus import EventBus
from services.runtime.readmodel import ReadModel


def _record(projection: Projection) -> BaseModel:
    return projection.record if isinstance(projection, KeyProjection) else projection


async def replay_into_scratch(bus: EventBus) -> dict[str, BaseModel]:
    """Every record the stream up to its current head folds into, by read-model key."""
    head = (await bus.js.stream_info(EVENTS_STREAM)).state.last_seq
    records: dict[str, BaseModel] = {}

    async def collect(projections: list[Projection]) -> None:
        for projection in projections:
            records[projection_key(projection)] = _record(projection)

    ledger = Ledger(persistence_env(None))
    folder = Folder(ledger, collect, start_after=0)
    stop = asyncio.Event()
    worker = asyncio.create_task(folder.run(stop))
    subscription = await follow(bus, folder)
    try:
        await folder.wait_through(head)
    finally:
        await subscription.unsubscribe()
        stop.set()
        await worker
        ledger.close()
    return records


async def diff_against_live(bus: EventBus, read_model: ReadModel) -> list[str]:
    """Keys whose live record differs from a fresh replay; empty when the live read model is right.

    Facts published while the check runs can make the live side newer: rerun before trusting a difference.
    """
    differences: list[str] = []
    for key, expected in (await replay_into_scratch(bus)).items():
        try:
            value = (await read_model.kv.get(key)).value
        except nats.js.errors.KeyNotFoundError:
            value = None
        if value is None:
            differences.append(f"{key}: missing from the read model")
            continue
        live = type(expected).model_validate_json(value)
        if live.model_dump() != expected.model_dump():
            differences.append(f"{key}: live {live.model_dump_json()} != replayed {expected.model_dump_json()}")
    return differences
