"""Helpers tests share: reading a batch's facts back from the real EVENTS stream, and writing read model records
and executors' adverts by hand where the ledger's projection and the executors would."""

import asyncio
import os
from collections.abc import Callable
from contextlib import aclosing

from contracts.events.executor import ExecutorAdvert
from contracts.events.registry import AnyEvent, decode_event
from contracts.readmodel import ApiKeyRecord, BatchRecord
from contracts.subjects import batch_events, read_model_key
from services.runtime.nats import eventlog
from services.runtime.nats.bus import EventBus
from services.runtime.nats.fleet import Fleet
from services.runtime.nats.readmodel import ReadModel


async def batch_facts(bus: EventBus, batch_id: str, until: Callable[[AnyEvent], bool],
                      timeout_s: float = 60.0) -> list[AnyEvent]:
    """Every event of the batch, in stream order, up to and including the first one `until` accepts."""
    facts: list[AnyEvent] = []
    async with asyncio.timeout(timeout_s), aclosing(eventlog.follow(bus, batch_events(batch_id))) as log:
        async for arrived in log:
            for fact in arrived:
                facts.append(decode_event(fact.data))
                if until(facts[-1]):
                    return facts
    raise AssertionError("the log ended")  # follow never ends


async def put_batch(read_model: ReadModel, record: BatchRecord) -> None:
    await read_model.put(read_model_key("batch", record.batch.id), record)


async def put_api_key(read_model: ReadModel, key_sha256: str, record: ApiKeyRecord) -> None:
    await read_model.put(read_model_key("apikey", key_sha256), record)


async def advertise(fleet: Fleet, advert: ExecutorAdvert) -> None:
    """Write an advert as its executor would (a test standing in for the executor)."""
    await fleet.kv.put(advert.executor_id, advert.model_dump_json().encode())


async def withdraw(fleet: Fleet, executor_id: str) -> None:
    await fleet.kv.delete(executor_id)


def engine_threads() -> str:
    """The threads every llama.cpp engine of the suite computes on (tests/conftest.py sets one), for an engine built
    in a test and an executor started with a host's bare environment (a host's own setting, like its metrics port).
    The default two, on two cores shared with three other test workers, spin waiting on a descheduled sibling: a
    40-token line took over a minute, and the spinning slowed every other worker."""
    return os.environ.get("SHESHNAG_EXECUTOR_N_THREADS", "1")
