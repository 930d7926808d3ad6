"""The scheduler against the real broker: one leader among two, leases, loss of an executor, reassignment.

Executors here are what the scheduler sees of them: adverts in the fleet bucket and run commands on WORK.
"""

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import nats.errors
import nats.js.errors
import pytest
from nats.js.api import DeliverPolicy

from contracts.commands import RunBatch
from contracts.events.batch import AttemptFailed, BatchAssigned, BatchValidated
from contracts.events.executor import DeviceMemory, ExecutorAdvert, ExecutorRegistered
from contracts.events.registry import AnyEvent, decode_event
from contracts.ids import new_batch_id
from contracts.subjects import EXECUTORS_BUCKET, WORK_STREAM, batch_events, run_command
from services.runtime.nats.bus import EventBus
from services.runtime.nats.fleet import ADVERT_TTL_S, MAX_ADVERT_VALUE_BYTES, Fleet
from services.runtime.nats.kv import open_bucket
from services.runtime.process.settings import ConnectionSettings
from services.scheduler.app import run_scheduler
from services.scheduler.settings import SchedulerSettings
from tests.conftest import RunningNats
from tests.factories import batch_created
from tests.support import advertise, batch_facts, withdraw

MODEL = "smollm2-135m-instruct-q4_1"


def advert(executor_id: str, protocol: int = 1) -> ExecutorAdvert:
    return ExecutorAdvert(executor_id=executor_id, engine="llamacpp", engine_version="t", models=[MODEL],
                          loaded_models=[MODEL], slots=8, heartbeat_at=int(time.time() * 1000), parallel_attempts=8,
                          devices=[DeviceMemory(name="cpu", total_bytes=2**34, free_bytes=2**33)], protocol=protocol)


@asynccontextmanager
async def scheduler(url: str) -> AsyncIterator[asyncio.Task[None]]:
    settings = SchedulerSettings(connection=ConnectionSettings(nats_url=url), tick_s=0.2, leader_ttl_s=2.0)
    stop = asyncio.Event()
    task = asyncio.create_task(run_scheduler(settings, stop))
    try:
        yield task
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 10)


async def validated_batch(bus: EventBus) -> str:
    batch_id = new_batch_id()
    await bus.publish(batch_created(batch_id, "k", "files/f", created_at=0, expires_at=int(time.time()) + 3600))
    await bus.publish(BatchValidated(aggregate_id=batch_id, total_lines=2, model=MODEL))
    return batch_id


async def heartbeats(fleet: Fleet, executor_id: str, protocol: int = 1) -> None:
    """As a live executor does: a fresh advert every second, until cancelled."""
    while True:
        await advertise(fleet, advert(executor_id, protocol))
        await asyncio.sleep(1.0)


async def admit(bus: EventBus, *executor_ids: str, protocol: int = 1) -> None:
    """As the registrar records an executor that proved a worker key."""
    for executor_id in executor_ids:
        await bus.publish(ExecutorRegistered(aggregate_id=executor_id, advert=advert(executor_id, protocol),
                                             started_at=int(time.time() * 1000), worker_key_id="key_test"))


async def sent_commands(bus: EventBus, executor_id: str, wait_s: float = 1.0) -> list[bytes]:
    """The run commands sent to the executor, as they travel."""
    subscription = await bus.js.pull_subscribe(run_command(executor_id), durable=f"test-{executor_id}",
                                               stream=WORK_STREAM)
    try:
        messages = await subscription.fetch(10, timeout=wait_s)
    except nats.errors.TimeoutError:
        return []
    for message in messages:
        await message.ack()
    return [message.data for message in messages]


async def run_commands(bus: EventBus, executor_id: str, wait_s: float = 1.0) -> list[RunBatch]:
    return [RunBatch.model_validate_json(data) for data in await sent_commands(bus, executor_id, wait_s)]


async def test_each_executor_gets_its_run_command_in_the_shape_it_advertised_it_takes(
        fresh_nats: RunningNats) -> None:
    bus = await EventBus.connect(fresh_nats.url, "test")
    fleet = await Fleet.open(bus)
    await admit(bus, "e-old")
    await admit(bus, "e-new", protocol=2)
    async with scheduler(fresh_nats.url):
        sent: dict[str, bytes] = {}
        for executor_id, protocol in (("e-old", 1), ("e-new", 2)):
            beats = asyncio.create_task(heartbeats(fleet, executor_id, protocol))
            batch_id = await validated_batch(bus)
            await batch_facts(bus, batch_id, lambda e: isinstance(e, BatchAssigned), timeout_s=15)
            [sent[executor_id]] = await sent_commands(bus, executor_id, wait_s=5.0)
            beats.cancel()
            await withdraw(fleet, executor_id)  # the next batch goes to the other one
    old, new = json.loads(sent["e-old"]), json.loads(sent["e-new"])
    assert "terms" not in old and old["owner_key_id"] == "k" and old["input_object_key"] == "files/f"
    assert "owner_key_id" not in new and new["terms"]["owner_key_id"] == "k"
    assert {RunBatch.model_validate(shape).terms.input_object_key for shape in (old, new)} == {"files/f"}
    await bus.close()


async def test_two_schedulers_assign_a_batch_once_and_the_standby_takes_over_a_lost_executor(
        fresh_nats: RunningNats) -> None:
    bus = await EventBus.connect(fresh_nats.url, "test")
    fleet = await Fleet.open(bus)
    await admit(bus, "e1", "e2")
    e1_beats = asyncio.create_task(heartbeats(fleet, "e1"))
    async with scheduler(fresh_nats.url), scheduler(fresh_nats.url) as second:
        batch_id = await validated_batch(bus)
        facts = await batch_facts(bus, batch_id, lambda e: isinstance(e, BatchAssigned), timeout_s=15)
        assert [(f.executor_id, f.attempt) for f in facts if isinstance(f, BatchAssigned)] == [("e1", 1)]
        commands = await run_commands(bus, "e1")
        assert [(c.batch_id, c.attempt) for c in commands] == [(batch_id, 1)]

        e1_beats.cancel()
        await withdraw(fleet, "e1")  # e1 stops heartbeating: lost once its last heartbeat is 15 s old
        e2_beats = asyncio.create_task(heartbeats(fleet, "e2"))
        facts = await batch_facts(bus, batch_id, lambda e: isinstance(e, BatchAssigned) and e.attempt == 2,
                                  timeout_s=40)
        e2_beats.cancel()
        failed = [f for f in facts if isinstance(f, AttemptFailed)]
        assert [(f.attempt, f.executor_id, f.code) for f in failed] == [(1, "e1", "executor_lost")]
        assert [c.attempt for c in await run_commands(bus, "e2")] == [2]
        assert not second.done()
    await bus.close()


async def facts_so_far(bus: EventBus, batch_id: str) -> list[AnyEvent]:
    """Every fact of the batch in the log now."""
    subscription = await bus.js.subscribe(batch_events(batch_id), ordered_consumer=True,
                                          deliver_policy=DeliverPolicy.ALL)
    facts: list[AnyEvent] = []
    try:
        while True:
            facts.append(decode_event((await subscription.next_msg(timeout=1.0)).data))
    except nats.errors.TimeoutError:
        return facts
    finally:
        await subscription.unsubscribe()


async def test_an_executor_declared_lost_that_heartbeats_again_is_given_new_work_and_keeps_it(
        fresh_nats: RunningNats) -> None:
    bus = await EventBus.connect(fresh_nats.url, "test")
    fleet = await Fleet.open(bus)
    await admit(bus, "e5")
    beating = asyncio.create_task(heartbeats(fleet, "e5"))
    async with scheduler(fresh_nats.url):
        first = await validated_batch(bus)
        await batch_facts(bus, first, lambda e: isinstance(e, BatchAssigned), timeout_s=15)
        beating.cancel()  # paused (SIGSTOP, a GC stall): no heartbeat past its lease
        await withdraw(fleet, "e5")
        await batch_facts(bus, first, lambda e: isinstance(e, AttemptFailed), timeout_s=40)

        beating = asyncio.create_task(heartbeats(fleet, "e5"))  # resumed
        second = await validated_batch(bus)
        await batch_facts(bus, second, lambda e: isinstance(e, BatchAssigned), timeout_s=15)
        await asyncio.sleep(3.0)  # ticks and heartbeats later, its new work is still its own
        beating.cancel()
        runs = {batch_id: [(f.attempt, type(f).__name__, f.executor_id) for f in await facts_so_far(bus, batch_id)
                           if isinstance(f, BatchAssigned | AttemptFailed)] for batch_id in (first, second)}
        assert runs == {first: [(1, "BatchAssigned", "e5"), (1, "AttemptFailed", "e5"), (2, "BatchAssigned", "e5")],
                        second: [(1, "BatchAssigned", "e5")]}
    await bus.close()


async def test_a_standby_scheduler_leads_when_the_leader_stops(fresh_nats: RunningNats) -> None:
    bus = await EventBus.connect(fresh_nats.url, "test")
    fleet = await Fleet.open(bus)
    await admit(bus, "e3")
    async with scheduler(fresh_nats.url) as first:
        await asyncio.sleep(0.5)  # first wins the lease
        async with scheduler(fresh_nats.url):
            first.cancel()  # the leader stops
            await advertise(fleet, advert("e3"))
            batch_id = await validated_batch(bus)
            facts = await batch_facts(bus, batch_id, lambda e: isinstance(e, BatchAssigned), timeout_s=15)
            assert [f.executor_id for f in facts if isinstance(f, BatchAssigned)] == ["e3"]
    await bus.close()


async def test_executors_join_only_with_a_live_worker_key_and_user_or_revoked_keys_are_refused(
        fresh_nats: RunningNats) -> None:
    from contracts.commands import ExecutorRegistration, RegistrationAnswer
    from contracts.events.key import KeyCreated, KeyRevoked
    from contracts.ids import hash_api_key
    from contracts.subjects import fleet_registrations

    bus = await EventBus.connect(fresh_nats.url, "test")
    gone = hash_api_key("wk-gone")  # revoked before wk-good exists: folded once wk-good is accepted
    await bus.publish(KeyCreated(aggregate_id=gone[:32], key_sha256=gone, role="worker", label="gone"))
    await bus.publish(KeyRevoked(aggregate_id=gone[:32], key_sha256=gone))
    for plaintext, role in (("wk-good", "worker"), ("gk-user", "user")):
        digest = hash_api_key(plaintext)
        await bus.publish(KeyCreated(aggregate_id=digest[:32], key_sha256=digest, role=role, label=role))
    ledger_stop = asyncio.Event()
    ledger = asyncio.create_task(_run_ledger(fresh_nats.url, ledger_stop))

    async def ask(worker_key: str) -> RegistrationAnswer:
        request = ExecutorRegistration(executor_id="e-new", worker_key=worker_key, advert=advert("e-new"))
        for _ in range(50):
            try:
                reply = await bus.nc.request(fleet_registrations("e-new"), request.model_dump_json().encode(),
                                             timeout=1)
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
                continue
            answer = RegistrationAnswer.model_validate_json(reply.data)
            if not answer.retry and (answer.accepted or answer.reason != "Unknown worker key."):
                return answer
            await asyncio.sleep(0.2)  # the scheduler or the ledger may not have read the log yet
        return answer

    async with scheduler(fresh_nats.url):
        refused = await ask("gk-user")
        assert not refused.accepted and "user key cannot register" in (refused.reason or "")
        assert not (await ask("wk-nope")).accepted
        accepted = await ask("wk-good")
        assert accepted.accepted and accepted.worker_key_id
        revoked = await ask("wk-gone")
        assert not revoked.accepted and "revoked" in (revoked.reason or "")

        fleet = await Fleet.open(bus)
        await advertise(fleet, advert("e-new"))
        await advertise(fleet, advert("e-unregistered"))
        batch_id = await validated_batch(bus)
        facts = await batch_facts(bus, batch_id, lambda e: isinstance(e, BatchAssigned), timeout_s=15)
        assert [f.executor_id for f in facts if isinstance(f, BatchAssigned)] == ["e-new"]
    ledger_stop.set()
    await asyncio.wait_for(ledger, 10)
    await bus.close()


async def _run_ledger(url: str, stop: asyncio.Event) -> None:
    from services.ledger.app import run_ledger
    from services.ledger.settings import LedgerSettings

    await run_ledger(LedgerSettings(connection=ConnectionSettings(nats_url=url)), stop)


async def test_the_executors_bucket_refuses_an_advert_far_larger_than_any_executor_writes(
        fresh_nats: RunningNats) -> None:
    """Every tick the leader reads and parses every advert, and an executor may write its key under each id it was
    admitted as: the bucket takes no value far above an advert's bound (a bucket made without the bound gets it)."""
    bus = await EventBus.connect(fresh_nats.url, "test")
    await open_bucket(bus, EXECUTORS_BUCKET, ADVERT_TTL_S)  # as an executor without admissions makes it: unbounded
    await Fleet.open(bus)
    await bus.js.publish(f"$KV.{EXECUTORS_BUCKET}.e-honest", advert("e-honest").model_dump_json().encode())
    fat = advert("e-fat").model_dump(mode="json") | {"pad": "x" * MAX_ADVERT_VALUE_BYTES}
    with pytest.raises(nats.js.errors.APIError):
        await bus.js.publish(f"$KV.{EXECUTORS_BUCKET}.e-fat", json.dumps(fat).encode())
    assert [a.executor_id for a in await Fleet(await open_bucket(bus, EXECUTORS_BUCKET)).adverts()] == ["e-honest"]
    await bus.close()
