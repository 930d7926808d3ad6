"""Nothing secret goes to a broker on the network before it proved who it is (services/runtime/nats/tls.py): to an
impostor that does not speak TLS, a service and an executor send a TLS ClientHello and nothing else, even with a
tls:// URL and the CA set; a nats:// URL to another host is refused before any connection; the real broker,
requiring TLS, is reached TLS first, and without its CA a tool gives up saying why."""

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from services.executor.adapters.broker import join
from services.executor.settings import ExecutorSettings
from services.runtime.nats.broker import TOOL_ATTEMPTS, BrokerUnreachable
from services.runtime.nats.bus import EventBus
from services.runtime.nats.tls import InsecureBrokerUrl
from services.runtime.process.settings import ConnectionSettings
from tests.certificates import write_tls_files
from tests.integration.tls_broker import Impostor, TlsBroker, impostor_broker, tls_nats

PASSWORD, WORKER_KEY = "core-password-0123", "wk-secret-0123"
TLS_HANDSHAKE_RECORD = b"\x16\x03"
"""How every TLS connection starts: a handshake record (the ClientHello)."""
TRIES_S = 1.0


@pytest.fixture
async def impostor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Impostor]:
    """An impostor broker, and this process configured with a CA as a provider host would be."""
    monkeypatch.setenv("SHESHNAG_NATS_TLS_CA", str(write_tls_files(tmp_path).ca))
    async with impostor_broker() as running:
        yield running


@pytest.fixture
def tls_broker(tmp_path: Path) -> Iterator[TlsBroker]:
    with tls_nats(tmp_path) as broker:
        yield broker


def sent_nothing_but_a_client_hello(impostor: Impostor, *secrets: str) -> bool:
    received = bytes(impostor.received)
    return (impostor.connections > 0 and received.startswith(TLS_HANDSHAKE_RECORD) and b"CONNECT" not in received
            and not any(secret.encode() in received for secret in secrets))


async def keeps_trying(connecting: "asyncio.Future[object] | asyncio.Task[object]") -> None:
    """A service waits for its broker forever: it is stopped after a few attempts."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(connecting, TRIES_S)


async def test_a_service_sends_an_impostor_a_client_hello_and_never_its_password(impostor: Impostor) -> None:
    await keeps_trying(asyncio.ensure_future(EventBus.connect(f"tls://core:{PASSWORD}@{impostor.url}", "tests")))
    assert sent_nothing_but_a_client_hello(impostor, PASSWORD), bytes(impostor.received[:200])


async def test_an_executor_sends_an_impostor_a_client_hello_and_never_its_worker_key(impostor: Impostor) -> None:
    settings = ExecutorSettings(connection=ConnectionSettings(nats_url=f"tls://{impostor.url}"),
                                executor_id="provider-host-1", worker_key=WORKER_KEY)
    await keeps_trying(asyncio.ensure_future(join(settings, asyncio.Event())))
    assert sent_nothing_but_a_client_hello(impostor, WORKER_KEY), bytes(impostor.received[:200])


async def test_a_nats_url_to_another_host_is_refused_before_any_connection(impostor: Impostor) -> None:
    plain = f"nats://core:{PASSWORD}@{impostor.url}"
    with pytest.raises(InsecureBrokerUrl, match="SHESHNAG_NATS_URL") as refused:
        await EventBus.connect(plain, "tests")
    with pytest.raises(InsecureBrokerUrl):
        await join(ExecutorSettings(connection=ConnectionSettings(nats_url=f"nats://{impostor.url}"),
                                    executor_id="provider-host-1", worker_key=WORKER_KEY), asyncio.Event())
    assert PASSWORD not in str(refused.value)
    assert impostor.connections == 0


async def test_services_reach_the_real_broker_tls_first_with_its_ca(
        tls_broker: TlsBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHESHNAG_NATS_TLS_CA", str(tls_broker.ca))
    bus = await EventBus.connect(tls_broker.core_url, "tests")
    try:
        assert bus.nc.options["tls_handshake_first"] and bus.nc.connected_url is not None
        assert (await bus.js.stream_info("EVENTS")).config.name == "EVENTS"
        assert await bus.broker.connect() is bus.nc  # the routers' broker runs on the same TLS connection
    finally:
        await bus.broker.stop()


async def test_a_tool_without_the_brokers_ca_gives_up_saying_the_certificate_was_not_verified(
        tls_broker: TlsBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SHESHNAG_NATS_TLS_CA", raising=False)
    with pytest.raises(BrokerUnreachable, match="CERTIFICATE_VERIFY_FAILED"):
        await asyncio.wait_for(EventBus.connect(tls_broker.core_url, "tests", attempts=TOOL_ATTEMPTS), 30)
