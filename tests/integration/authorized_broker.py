"""A real nats-server run with the embedded stack's authorization (the core user, auth callout for executors), with
worker, revoked and user keys in its read model and a responder admitting executors, as a scheduler runs it."""

import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import nats.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from pydantic import BaseModel

from contracts.commands import AdmissionAsk, AdvertUpdate
from contracts.ids import hash_api_key
from contracts.readmodel import ApiKeyRecord
from contracts.subjects import admission_asks, advert_updates
from infra.embedded import free_port, start_nats, stop_process
from infra.nats_auth import NatsAuth
from services.authz.callout import CALLOUT, Admissions, ExecutorAuthority, open_admissions
from services.authz.relay import ACKS, ADMISSIONS, ADVERTS, PULLS, admission_terms, relay_ack, relay_pull, write_advert
from services.executor.settings import ExecutorSettings
from services.runtime.nats.answers import RawAnswer
from services.runtime.nats.bus import EventBus
from services.runtime.nats.fleet import Fleet
from services.runtime.nats.readmodel import ReadModel
from services.runtime.process.settings import ConnectionSettings
from tests.integration.router_support import bare
from tests.support import put_api_key

WORKER_KEY, OTHER_WORKER_KEY, REVOKED_KEY, USER_KEY = "wk-alpha", "wk-bravo", "wk-revoked", "gk-user"


@dataclass
class BareAdmissions:
    """`open_admissions` answering `CALLOUT` and relaying executors' requests (`services/authz/relay.py`) on bare
    nats-py subscriptions: a fleet without a scheduler's broker."""

    admissions: Admissions
    responders: list[Subscription]

    async def close(self) -> None:
        for responder in self.responders:
            with contextlib.suppress(nats.errors.ConnectionClosedError, nats.errors.BadSubscriptionError):
                await responder.unsubscribe()
        await self.admissions.close()


async def admit_executors(bus: EventBus, settings: ConnectionSettings) -> BareAdmissions:
    admissions = await open_admissions(bus, settings)
    assert admissions is not None
    authority, fleet = admissions.authority, await Fleet.open(bus)
    raw: list[tuple[RawAnswer, Callable[[ExecutorAuthority, Msg], Awaitable[None]]]] = [
        (CALLOUT, ExecutorAuthority.on_request), (PULLS, relay_pull), (ACKS, relay_ack)]
    responders = [await bus.nc.subscribe(row.subject, queue=row.queue, cb=functools.partial(handler, authority))
                  for row, handler in raw]
    async def advert(executor_id: str, update: AdvertUpdate) -> BaseModel:
        return await write_advert(update, executor_id, fleet, None)

    async def terms(executor_id: str, ask: AdmissionAsk) -> BaseModel:
        return await admission_terms(ask, executor_id, authority)

    responders.append(await bus.nc.subscribe(advert_updates("*"), queue=ADVERTS.queue, cb=bare(ADVERTS, advert)))
    responders.append(await bus.nc.subscribe(admission_asks("*"), queue=ADMISSIONS.queue, cb=bare(ADMISSIONS, terms)))
    return BareAdmissions(admissions, responders)


@dataclass
class AuthorizedBroker:
    port: int
    auth: NatsAuth
    core: EventBus
    read_model: ReadModel
    settings: ConnectionSettings
    callout: BareAdmissions
    """The responder admitting executors: close it to play a fleet with no scheduler up."""

    async def answer_callout_again(self) -> None:
        self.callout = await admit_executors(self.core, self.settings)

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def executor_settings(self, executor_id: str, worker_key: str) -> ExecutorSettings:
        return ExecutorSettings(connection=ConnectionSettings(nats_url=self.url), executor_id=executor_id,
                                worker_key=worker_key)


@contextlib.contextmanager
def authorized_nats(data_dir: Path) -> Iterator[tuple[int, NatsAuth]]:
    auth = NatsAuth.load_or_create(data_dir)
    port = free_port()
    process = start_nats(data_dir, port, data_dir / "nats.log", auth.write_server_config(data_dir))
    try:
        yield port, auth
    finally:
        stop_process(process)


@contextlib.asynccontextmanager
async def admitting_broker(data_dir: Path, ttl_s: float = 3600.0) -> AsyncIterator[AuthorizedBroker]:
    """A broker with keys in its read model and a responder admitting executors, as a scheduler runs it."""
    with authorized_nats(data_dir) as (port, auth):
        core = await EventBus.connect(auth.core_url(port), "tests-core")
        read_model = await ReadModel.open(core)
        for key, key_id, role, revoked in ((WORKER_KEY, "key_alpha", "worker", False),
                                           (OTHER_WORKER_KEY, "key_bravo", "worker", False),
                                           (REVOKED_KEY, "key_revoked", "worker", True),
                                           (USER_KEY, "key_user", "user", False)):
            await put_api_key(read_model, hash_api_key(key), ApiKeyRecord(key_id=key_id, role=role, label=key_id,
                                                                          revoked=revoked))
        settings = ConnectionSettings(nats_url=auth.core_url(port), nats_callout_seed=auth.issuer_seed,
                                      nats_executor_ttl_s=ttl_s)
        callout = await admit_executors(core, settings)
        running = AuthorizedBroker(port, auth, core, read_model, settings, callout)
        try:
            yield running
        finally:
            await running.callout.close()
            await core.close()
