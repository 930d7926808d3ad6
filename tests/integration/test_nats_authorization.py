"""NATS authorization against a real nats-server run with the embedded stack's config: the core user, and auth
callout admitting executors by worker key with the permissions of `contracts/permissions.py`."""

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import nats
import nats.errors
import nats.js.errors
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from contracts.events.executor import ExecutorAdvert
from contracts.ids import hash_api_key
from contracts.readmodel import ApiKeyRecord, ExecutorRecord
from contracts.subjects import (
    EVENTS_STREAM,
    EXECUTORS_BUCKET,
    FLEET_REGISTER,
    READ_MODEL_BUCKET,
    WORK_STREAM,
    executor_durable,
    executor_finalize_durable,
    executor_pulls,
    finalize_command,
    fleet_registrations,
    read_model_key,
    run_command,
)
from services.executor.adapters import broker
from services.executor.adapters.advert import OwnAdvert
from services.runtime.nats.bus import ConsumerPolicy, EventBus
from services.runtime.nats.kv import open_bucket
from tests.integration.authorized_broker import (
    OTHER_WORKER_KEY,
    REVOKED_KEY,
    USER_KEY,
    WORKER_KEY,
    AuthorizedBroker,
    admitting_broker,
    authorized_nats,
)
from tests.integration.durables import durable_subscription
from tests.support import put_api_key

DENIED_WITHIN_S = 1.0
ADVERT = ExecutorAdvert(executor_id="alpha", engine="llamacpp", engine_version="1", models=[], loaded_models=[],
                        devices=[], slots=1, heartbeat_at=1)


@pytest.fixture(scope="module")
async def broker_with_auth(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[AuthorizedBroker]:
    async with admitting_broker(tmp_path_factory.mktemp("nats-auth")) as running:
        yield running


@dataclass
class Violations:
    seen: list[str]

    async def on_error(self, error: Exception) -> None:
        self.seen.append(str(error).lower())

    async def wait_for(self, subject: str) -> None:
        """Until the server reported a permissions violation naming `subject`."""
        deadline = time.monotonic() + DENIED_WITHIN_S * 3
        while not any("permissions violation" in seen and subject.lower() in seen for seen in self.seen):
            assert time.monotonic() < deadline, f"no permissions violation for {subject}; saw {self.seen}"
            await asyncio.sleep(0.05)


@pytest.fixture
async def alpha(broker_with_auth: AuthorizedBroker) -> AsyncIterator[tuple[EventBus, Violations]]:
    """Executor `alpha` connected with its worker key, its permission violations recorded."""
    stop = asyncio.Event()
    bus = await broker.join(broker_with_auth.executor_settings("alpha", WORKER_KEY), stop)
    assert bus is not None
    violations = Violations([])
    bus.nc._error_cb = violations.on_error
    yield bus, violations
    await bus.close()


async def refused(url: str, user: str, password: str, tries: int = 3) -> bool:
    """True when the server refuses the connection as an authorization violation, False when it lets it in. Another
    failure (a loaded server's connect timing out, or closing before its -ERR is read) is tried again."""
    failure: BaseException | None = None
    for _ in range(tries):
        try:
            client: Client = await nats.connect(url, user=user, password=password, allow_reconnect=False,
                                                connect_timeout=10)
        except (nats.errors.Error, TimeoutError, OSError) as error:
            if "authorization violation" in str(error).lower():
                return True
            failure = error
            continue
        await client.close()
        return False
    raise AssertionError(f"neither refused nor let in {tries} times; last: {failure!r}")


async def request_until_answered(bus: EventBus, subject: str, payload: bytes, within_s: float = 10.0) -> bytes:
    """The answer to a request across accounts: a loaded server may still be spreading a new responder's interest
    to the importing account, so "no responders" is asked again (a permission violation never is)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return (await bus.nc.request(subject, payload, timeout=5)).data
        except nats.errors.NoRespondersError:
            assert time.monotonic() < deadline, f"nobody answered {subject} within {within_s}s"
            await asyncio.sleep(0.1)


async def test_an_executor_with_a_live_worker_key_does_its_jobs_operations(
        broker_with_auth: AuthorizedBroker, alpha: tuple[EventBus, Violations]) -> None:
    bus, violations = alpha
    core = broker_with_auth.core
    await core.js.publish(run_command("alpha"), b"run", stream=WORK_STREAM)
    await core.js.publish(finalize_command("alpha"), b"finalize", stream=WORK_STREAM)
    for durable, subject, data in ((executor_durable("alpha"), run_command("alpha"), b"run"),
                                   (executor_finalize_durable("alpha"), finalize_command("alpha"), b"finalize")):
        subscription = await durable_subscription(bus, WORK_STREAM, durable, [subject], ConsumerPolicy(), made_by=core,
                                                  pulls_via=executor_pulls("alpha"))
        [message] = await subscription.fetch(1, timeout=5)
        assert message.data == data
        await message.ack_sync()
        await subscription.unsubscribe()

    heartbeats = await OwnAdvert.open(bus, "alpha", admitted=True)
    await heartbeats.advertise(ADVERT)
    assert (await (await open_bucket(core, EXECUTORS_BUCKET)).get("alpha")).value == ADVERT.model_dump_json().encode()
    await heartbeats.withdraw()
    with pytest.raises(nats.js.errors.KeyNotFoundError):
        await (await open_bucket(core, EXECUTORS_BUCKET)).get("alpha")

    async def welcome(message: Msg) -> None:
        await message.respond(b"welcome")

    answering = await core.nc.subscribe(FLEET_REGISTER, cb=welcome)
    await core.nc.flush()
    assert await request_until_answered(bus, fleet_registrations("alpha"), b"hello") == b"welcome"
    await answering.unsubscribe()
    assert violations.seen == []


async def test_an_executor_cannot_take_another_executors_commands_or_heartbeat(
        broker_with_auth: AuthorizedBroker, alpha: tuple[EventBus, Violations]) -> None:
    bus, violations = alpha
    core = broker_with_auth.core
    await core.js.publish(run_command("bravo"), b"for bravo", stream=WORK_STREAM)
    await core.js.publish(finalize_command("bravo"), b"bravo finalizes", stream=WORK_STREAM)
    await durable_subscription(core, WORK_STREAM, executor_durable("bravo"), [run_command("bravo")],
                               ConsumerPolicy())
    await durable_subscription(core, WORK_STREAM, executor_finalize_durable("bravo"), [finalize_command("bravo")],
                               ConsumerPolicy())
    stolen = [f"$JS.API.CONSUMER.MSG.NEXT.{WORK_STREAM}.{executor_durable('bravo')}",
              f"$JS.API.CONSUMER.MSG.NEXT.{WORK_STREAM}.{executor_finalize_durable('bravo')}",
              f"$JS.API.CONSUMER.CREATE.{WORK_STREAM}.{executor_durable('alpha')}.{run_command('bravo')}",
              f"$JS.API.CONSUMER.CREATE.{WORK_STREAM}.{executor_finalize_durable('alpha')}.{finalize_command('bravo')}",
              f"$JS.API.CONSUMER.CREATE.{WORK_STREAM}.{executor_finalize_durable('bravo')}.cmd.>",
              f"$JS.API.CONSUMER.CREATE.{WORK_STREAM}.finalizers.cmd.>",
              f"$JS.API.CONSUMER.DURABLE.CREATE.{WORK_STREAM}.{executor_durable('bravo')}",
              # Not even its own: its scheduler makes them when it accepts its registration.
              f"$JS.API.CONSUMER.CREATE.{WORK_STREAM}.{executor_durable('alpha')}.{run_command('alpha')}",
              f"$KV.{EXECUTORS_BUCKET}.bravo",
              # Nor JetStream or the server for itself: they answer on any reply subject a request names.
              f"$JS.API.CONSUMER.MSG.NEXT.{WORK_STREAM}.{executor_durable('alpha')}",
              f"$JS.ACK.{WORK_STREAM}.{executor_durable('alpha')}.1.1.1.1.0", f"$KV.{EXECUTORS_BUCKET}.alpha",
              "$SYS.REQ.USER.INFO",
              f"{executor_pulls('alpha')}.CONSUMER.MSG.NEXT.{WORK_STREAM}.{executor_durable('bravo')}"]
    for subject in stolen:
        await Client.publish(bus.nc, subject, b"{}")  # as published, not routed to the relay as its acks are
        await violations.wait_for(subject)
    await bus.nc.subscribe(run_command("bravo"))
    await violations.wait_for(f"subscription to \"{run_command('bravo')}\"")

    for durable in (executor_durable("bravo"), executor_finalize_durable("bravo")):
        info = await core.js.consumer_info(WORK_STREAM, durable)
        assert info.num_pending == 1 and info.num_ack_pending == 0, "bravo's commands are still there, untouched"
    with pytest.raises(nats.errors.Error):
        await (await open_bucket(core, EXECUTORS_BUCKET)).get("bravo")


async def test_an_executor_cannot_read_the_event_log_or_the_read_model_nor_write_any_fact(
        broker_with_auth: AuthorizedBroker, alpha: tuple[EventBus, Violations]) -> None:
    """Not even its own batches' facts: the scheduler's fact desk reads and writes those for it (issue 13: an
    executor read every owner's `batch.created` and registered their objects as its own files)."""
    bus, violations = alpha
    reader = "executor-alpha-read-0"
    for key_filter in ("evt.batch.>", "evt.batch.batch_a.>", "evt.key.>", "evt.user.>", "evt.>", ">"):
        config = ConsumerConfig(name=reader, filter_subject=key_filter, deliver_policy=DeliverPolicy.ALL,
                                ack_policy=AckPolicy.NONE)
        with pytest.raises(nats.errors.TimeoutError):
            await bus.js.add_consumer(EVENTS_STREAM, config, timeout=DENIED_WITHIN_S)
        in_subject = "" if key_filter == ">" else f".{key_filter}"  # nats-py leaves a bare `>` out of the subject
        await violations.wait_for(f"$JS.API.CONSUMER.CREATE.{EVENTS_STREAM}.{reader}{in_subject}")
    direct = f"$JS.API.DIRECT.GET.KV_{READ_MODEL_BUCKET}.$KV.{READ_MODEL_BUCKET}.{read_model_key('apikey', 'x')}"
    forged = [f"$JS.API.STREAM.INFO.KV_{READ_MODEL_BUCKET}", "evt.key.key_alpha.created", "evt.user.someone.created",
              "evt.batch.batch_a.created", "evt.batch.batch_a.started", "evt.batch.batch_a.progressed",
              "evt.batch.batch_a.completed", "evt.file.file-a.stored", "evt.executor.alpha.noticed",
              f"$JS.API.DIRECT.GET.{EVENTS_STREAM}", f"$JS.API.STREAM.MSG.GET.{EVENTS_STREAM}",
              "evt.batch.batch_a.cancel_requested", "evt.file.file-a.deleted", "evt.executor.bravo.registered",
              direct, f"$JS.API.STREAM.CREATE.{EVENTS_STREAM}", f"$JS.API.CONSUMER.LIST.{EVENTS_STREAM}"]
    for subject in forged:
        await bus.nc.publish(subject, b"{}")
        await violations.wait_for(subject)
    await bus.nc.subscribe("_INBOX.>")
    await violations.wait_for('subscription to "_inbox.>"')


async def test_an_executor_can_list_or_describe_no_stream_bucket_or_consumer(
        broker_with_auth: AuthorizedBroker, alpha: tuple[EventBus, Violations]) -> None:
    """Issue 27: the info of EVENTS filtered on `evt.>` named every tenant's batches, files, users and providers and
    every key's hash prefix; that of WORK and of the executors bucket, every executor's id."""
    bus, violations = alpha
    core = broker_with_auth.core
    await open_bucket(core, EXECUTORS_BUCKET)
    await core.js.publish(run_command("bravo"), b"for bravo", stream=WORK_STREAM)
    js = bus.nc.jetstream(timeout=DENIED_WITHIN_S)
    with pytest.raises(nats.errors.TimeoutError):
        await js.stream_info(EVENTS_STREAM, subjects_filter="evt.>")
    await violations.wait_for(f"$JS.API.STREAM.INFO.{EVENTS_STREAM}")
    executors = f"KV_{EXECUTORS_BUCKET}"
    reads = [f"$JS.API.STREAM.INFO.{WORK_STREAM}", f"$JS.API.STREAM.INFO.{executors}",
             f"$JS.API.STREAM.INFO.KV_{READ_MODEL_BUCKET}", "$JS.API.STREAM.NAMES", "$JS.API.STREAM.LIST",
             "$JS.API.INFO", f"$JS.API.CONSUMER.LIST.{WORK_STREAM}", f"$JS.API.CONSUMER.NAMES.{WORK_STREAM}",
             f"$JS.API.CONSUMER.LIST.{EVENTS_STREAM}", f"$JS.API.CONSUMER.NAMES.{EVENTS_STREAM}",
             f"$JS.API.CONSUMER.INFO.{WORK_STREAM}.{executor_durable('bravo')}",
             f"$JS.API.CONSUMER.CREATE.{executors}", f"$JS.API.CONSUMER.CREATE.{executors}.watch.$KV.>",
             f"$JS.API.DIRECT.GET.{executors}", f"$JS.API.STREAM.MSG.GET.{executors}",
             f"$JS.API.CONSUMER.CREATE.{WORK_STREAM}", f"$JS.API.DIRECT.GET.{WORK_STREAM}"]
    for subject in reads:
        await bus.nc.publish(subject, b"{}")
        await violations.wait_for(subject)
    with pytest.raises(nats.errors.TimeoutError):
        await js.key_value(EXECUTORS_BUCKET)  # a KV handle, to list keys with, starts with the bucket's info


@pytest.mark.parametrize(("user", "password"), [
    ("alpha", REVOKED_KEY), ("alpha", USER_KEY), ("alpha", "wk-never-created"), ("alpha", ""),
    ("not.an.id", WORKER_KEY), ("", "garbage")])
async def test_revoked_user_and_unknown_keys_and_bad_executor_ids_are_refused_at_connect(
        broker_with_auth: AuthorizedBroker, user: str, password: str) -> None:
    assert await refused(broker_with_auth.url, user, password)


async def test_a_worker_key_cannot_take_over_an_executor_online_under_another(
        broker_with_auth: AuthorizedBroker) -> None:
    record = ExecutorRecord(executor_id="charlie", engine="llamacpp", engine_version="1", models=[],
                            worker_key_id="key_bravo", status="online", started_at=1)
    await broker_with_auth.core.js.publish(f"$KV.{READ_MODEL_BUCKET}.{read_model_key('executor', 'charlie')}",
                                           record.model_dump_json().encode())
    assert await refused(broker_with_auth.url, "charlie", WORKER_KEY)
    assert not await refused(broker_with_auth.url, "charlie", OTHER_WORKER_KEY)


async def test_without_a_scheduler_answering_nobody_but_the_core_user_gets_in(tmp_path: Path) -> None:
    with authorized_nats(tmp_path) as (port, auth):
        assert await refused(f"nats://127.0.0.1:{port}", "alpha", WORKER_KEY)
        assert await refused(f"nats://127.0.0.1:{port}", "core", "not-the-password")
        core = await EventBus.connect(auth.core_url(port), "tests-core")
        await core.close()


async def test_a_revoked_worker_key_is_shut_out_when_its_permissions_expire(tmp_path: Path) -> None:
    async with admitting_broker(tmp_path, ttl_s=1.0) as running:
        stop = asyncio.Event()
        bus = await broker.join(running.executor_settings("delta", WORKER_KEY), stop)
        assert bus is not None
        disconnected = asyncio.Event()

        async def on_disconnect() -> None:
            disconnected.set()

        bus.nc._disconnected_cb = on_disconnect
        await put_api_key(running.read_model, hash_api_key(WORKER_KEY), ApiKeyRecord(
            key_id="key_alpha", role="worker", label="revoked now", revoked=True))
        await asyncio.wait_for(disconnected.wait(), 10)
        await asyncio.sleep(1.5)  # reconnect attempts meanwhile are refused
        assert not bus.nc.is_connected, "the expired connection was not let back in"
        await bus.nc.close()
