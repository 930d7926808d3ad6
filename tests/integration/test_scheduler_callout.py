"""The auth callout as a scheduler answers it, a raw answer of its router on its own broker, against a real
nats-server with the embedded stack's authorization: without leading (every scheduler answers, leader or standby) it
lets in an executor with a live worker key and refuses a revoked one; without the issuer seed it declares none."""

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import nats

from contracts.ids import hash_api_key
from contracts.permissions import AUTH_CALLOUT_SUBJECT
from contracts.readmodel import ApiKeyRecord
from services.authz.callout import open_admissions
from services.runtime.nats.bus import EventBus
from services.runtime.nats.delivery import ServiceRouter
from services.runtime.nats.readmodel import ReadModel
from services.runtime.process.settings import ConnectionSettings
from services.scheduler.handlers import scheduler_router
from tests.integration.authorized_broker import REVOKED_KEY, WORKER_KEY, authorized_nats
from tests.integration.test_nats_authorization import refused
from tests.support import put_api_key


@contextlib.asynccontextmanager
async def answering_scheduler(tmp_path: Path, max_connections: int = 1024) -> AsyncIterator[str]:
    """A scheduler's router answering the callout (not leading) on a broker with the embedded stack's authorization,
    WORKER_KEY live and REVOKED_KEY revoked; the URL executors connect to."""
    with authorized_nats(tmp_path) as (port, auth):
        settings = ConnectionSettings(nats_url=auth.core_url(port), nats_callout_seed=auth.issuer_seed,
                                      nats_max_connections_per_provider=max_connections)
        router = scheduler_router(callout=True)
        bus = await EventBus.connect(settings.nats_url, "tests-scheduler")
        broker = bus.broker
        broker.include_router(router)
        read_model = await ReadModel.open(bus)
        for key, key_id, revoked in ((WORKER_KEY, "key_alpha", False), (REVOKED_KEY, "key_revoked", True)):
            await put_api_key(read_model, hash_api_key(key), ApiKeyRecord(key_id=key_id, role="worker", label=key_id,
                                                                          revoked=revoked))
        admissions = await open_admissions(bus, settings)
        assert admissions is not None
        broker.context.set_global(router.dependencies, admissions.authority)
        await broker.start()
        try:
            yield f"nats://127.0.0.1:{port}"
        finally:
            await admissions.close()
            await broker.close_within()


async def test_a_scheduler_not_leading_admits_a_live_worker_key_and_refuses_a_revoked_one(tmp_path: Path) -> None:
    async with answering_scheduler(tmp_path) as url:
        assert not await refused(url, "alpha", WORKER_KEY)
        assert await refused(url, "alpha", REVOKED_KEY)


async def test_a_worker_key_holds_at_most_its_share_of_connections_and_one_closed_frees_a_place(
        tmp_path: Path) -> None:
    async with answering_scheduler(tmp_path, max_connections=2) as url:
        held = [await nats.connect(url, user=user, password=WORKER_KEY, allow_reconnect=False, connect_timeout=10)
                for user in ("alpha", "beta")]
        try:
            assert await refused(url, "gamma", WORKER_KEY)
            await held.pop().close()
            deadline = time.monotonic() + 30  # the server's report of the close reaches the callout
            while await refused(url, "gamma", WORKER_KEY):
                assert time.monotonic() < deadline, "a closed connection never freed its place"
                await asyncio.sleep(0.2)
        finally:
            for client in held:
                await client.close()


def answered(router: ServiceRouter) -> set[str]:
    return {getattr(subscriber, "subject", "") for subscriber in router.subscribers}


def test_without_the_issuer_seed_a_scheduler_declares_no_callout() -> None:
    assert AUTH_CALLOUT_SUBJECT in answered(scheduler_router(callout=True))
    assert AUTH_CALLOUT_SUBJECT not in answered(scheduler_router(callout=False))
