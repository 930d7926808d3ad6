"""Executors outlive their broker credentials: against a real nats-server with the embedded stack's authorization
and a short `SHESHNAG_NATS_EXECUTOR_TTL_S`, an executor renews its admission before it expires (and, should it
expire, is let back in) and goes on working, several TTLs long, without redoing any work."""

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import nats.errors
import pytest

from contracts.events.batch import AttemptFailed, BatchCompleted, BatchProgressed, BatchStarted
from contracts.subjects import FLEET_REGISTER, WORK_STREAM, executor_durable, executor_pulls, run_command
from services.executor.adapters import broker
from services.executor.adapters.admission import expires_in, keep_admitted
from services.executor.adapters.advert import OwnAdvert
from services.executor.app import run_executor
from services.executor.settings import ExecutorSettings
from services.runtime.nats.bus import ConsumerPolicy
from services.runtime.nats.fleet import Fleet
from services.runtime.storage.objectstore import ObjectStore
from services.scheduler.book import Book
from services.scheduler.registration import REGISTRATIONS, Registrar
from tests.conftest import RunningS3
from tests.integration.authorized_broker import WORKER_KEY, AuthorizedBroker, admitting_broker
from tests.integration.desk_support import fact_desk, hold
from tests.integration.durables import durable_subscription
from tests.integration.router_support import bare
from tests.integration.test_executor_run import TINY_CATALOGUE, new_batch
from tests.integration.test_nats_authorization import ADVERT
from tests.support import batch_facts

TTL_S = 6.0
"""Short enough that the test spans several; long enough that a renewal on a busy 2-core machine is on time."""


@contextlib.asynccontextmanager
async def executor_on(running: AuthorizedBroker, s3: RunningS3, tmp_path: Path) -> AsyncIterator[ExecutorSettings]:
    """A real executor (the real model) joining the authorized broker with its worker key; the scheduler's own
    registrar answers its registration."""
    caught_up = asyncio.Event()
    caught_up.set()  # a registrar without a book's reader has nothing to read
    registrar = Registrar(running.core, running.read_model, Book(), caught_up)
    registering = await running.core.nc.subscribe(FLEET_REGISTER, cb=bare(REGISTRATIONS, registrar.answer))
    catalogue = tmp_path / "catalogue.toml"
    catalogue.write_text(TINY_CATALOGUE)
    settings = running.executor_settings("renewing", WORKER_KEY)
    settings = settings.model_copy(update={
        "connection": settings.connection.model_copy(update={
            "catalogue_path": catalogue, "s3_endpoint": s3.endpoint, "s3_access_key": s3.credentials.access_key,
            "s3_secret_key": s3.credentials.secret_key, "s3_bucket": "sheshnag-tests"}),
        "chunk_lines": 1, "heartbeat_s": 0.5, "stop_grace_s": 1.0})
    stop = asyncio.Event()
    running_executor = asyncio.create_task(run_executor(settings, stop))
    try:
        yield settings
        assert not running_executor.done(), "the executor stopped by itself"
    finally:
        stop.set()
        await asyncio.wait_for(running_executor, 20)
        await registering.unsubscribe()


def said(record: logging.LogRecord) -> str:
    """A log record's message with its exception's (nats-py logs the server's errors as the exception)."""
    return f"{record.getMessage()} {record.exc_info[1] if record.exc_info else ''}".lower()


async def test_an_executor_renews_its_admission_before_it_expires_and_runs_batches_across_several_ttls_once(
        tmp_path: Path, s3_server: RunningS3, object_store: ObjectStore, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="services.authz.callout")
    (tmp_path / "nats").mkdir()
    async with admitting_broker(tmp_path / "nats", ttl_s=TTL_S) as running, fact_desk(running.core) as book, \
            executor_on(running, s3_server, tmp_path) as executor:
        core = running.core
        started = time.monotonic()
        batches = []
        for _ in range(4):  # one batch every half TTL, the last well past three TTLs in
            command = await new_batch(object_store, executor)
            hold(book, command)
            await core.send(command)
            batches.append(command.batch_id)
            await asyncio.sleep(TTL_S / 2)
        done = [await batch_facts(core, batch_id, lambda fact: isinstance(fact, BatchCompleted), timeout_s=60)
                for batch_id in batches]
        await asyncio.sleep(max(0.0, 3.5 * TTL_S - (time.monotonic() - started)))  # past three TTLs, still up
        advert = {a.executor_id: a for a in await (await Fleet.open(core)).adverts()}[executor.executor_id]
        assert time.time() * 1000 - advert.heartbeat_at < 3_000, "its heartbeats still arrive"

        for facts in done:
            assert not [f for f in facts if isinstance(f, AttemptFailed)]
            assert [f.attempt for f in facts if isinstance(f, BatchStarted)] == [1]
            chunks = [f.chunk for f in facts if isinstance(f, BatchProgressed)]
            assert sorted(chunks) == list(range(4)), "each line committed once, by the one attempt"
        work = await core.js.consumer_info(WORK_STREAM, executor_durable(executor.executor_id))
        assert work.delivered.consumer_seq == len(batches) and work.num_redelivered == 0, "no command ran twice"
    admissions = [r for r in caplog.records if "executor renewing admitted" in r.getMessage()]
    assert len(admissions) >= 4, "it was admitted again, several times"
    expired = [r for r in caplog.records if "authentication expired" in said(r)]
    assert expired == [], "every renewal came before the admission expired"
    # Its broker's subscribers pull from and ack its own durables only (its registrar made them), under its own
    # inbox prefix.
    assert [said(r) for r in caplog.records if "permissions violation" in said(r)] == []


async def test_a_connection_whose_admission_expired_is_let_back_in_and_its_consumer_goes_on(tmp_path: Path) -> None:
    """What a paused executor meets on resuming past its expiry: the server cuts it off; it reconnects."""
    async with admitting_broker(tmp_path, ttl_s=2.0) as running:
        bus = await broker.join(running.executor_settings("sleepy", WORKER_KEY), asyncio.Event())
        assert bus is not None
        errors: list[str] = []

        async def on_error(error: Exception) -> None:
            errors.append(str(error).lower())

        bus.nc._error_cb = on_error
        received: list[tuple[bytes, int]] = []

        subscription = await durable_subscription(bus, WORK_STREAM, executor_durable("sleepy"),
                                                  [run_command("sleepy")], ConsumerPolicy(ack_wait_s=30),
                                                  made_by=running.core, pulls_via=executor_pulls("sleepy"))
        stop = asyncio.Event()

        async def consume() -> None:
            """Pull, take and ack, across the cut-offs (a pull that met one is simply asked again)."""
            while not stop.is_set():
                try:
                    messages = await subscription.fetch(1, timeout=1.0)
                except (nats.errors.TimeoutError, nats.errors.ConnectionReconnectingError):
                    continue
                for message in messages:
                    received.append((message.data, message.metadata.num_delivered))
                    await message.ack_sync()

        consuming = asyncio.create_task(consume())
        sent = [f"command {n}".encode() for n in range(8)]
        for data in sent:  # spread over three admissions
            await running.core.js.publish(run_command("sleepy"), data, stream=WORK_STREAM)
            await asyncio.sleep(0.75)
        for _ in range(100):
            if len(received) == len(sent):
                break
            await asyncio.sleep(0.1)
        stop.set()
        await asyncio.wait_for(consuming, 5)
        assert any("authentication expired" in error for error in errors), "its admission did expire"
        assert not bus.nc.is_closed
        assert received == [(data, 1) for data in sent]
        await bus.close()


async def test_while_no_scheduler_answers_the_callout_an_executor_keeps_its_admission_until_it_expires(
        tmp_path: Path) -> None:
    async with admitting_broker(tmp_path, ttl_s=5.0) as running:
        bus = await broker.join(running.executor_settings("patient", WORKER_KEY), asyncio.Event())
        assert bus is not None
        left = await expires_in(bus.nc, "patient")
        assert left is not None
        await running.callout.close()  # every scheduler is down
        stop = asyncio.Event()
        renewing = asyncio.create_task(keep_admitted(bus.nc, "patient", stop))
        await asyncio.sleep(left - 0.5)  # past the moment it would have renewed
        assert bus.nc.is_connected and bus.nc.stats["reconnects"] == 0, "it did not cut itself off early"

        # expired: shut out until a scheduler answers again (the server closes it at expiry; a loaded machine
        # may take a moment to notice)
        for _ in range(100):
            if not bus.nc.is_connected:
                break
            await asyncio.sleep(0.1)
        assert not bus.nc.is_connected and not bus.nc.is_closed
        await running.answer_callout_again()
        heartbeats = await OwnAdvert.open(bus, "patient", admitted=True)
        await asyncio.wait_for(heartbeats.advertise(ADVERT), 15)  # its heartbeat, let in
        assert not bus.nc.is_closed
        stop.set()
        await asyncio.wait_for(renewing, 5)
        await bus.close()
