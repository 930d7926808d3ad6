"""`sheshnag executor --deployment URL --worker-key wk-…` sends its worker key only where it is safe: a gateway on
another host (127.0.0.2 stands in for one) over plain http, one whose certificate is not from the pinned CA (or,
without a pin, from no CA the host trusts), one that names no CA though a pin was given, or one that names a
nats:// broker, are refused with a clear message before anything is sent; the genuine gateway is trusted."""

import argparse
import asyncio
import contextlib
import ssl
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

import infra.provider_join as join
from infra.embedded import free_port
from infra.tls import fingerprint
from tests.certificates import TlsFiles, write_tls_files
from tests.integration.tls_broker import NETWORK_HOST, impostor_broker

WORKER_KEY = "wk-provider-secret-0123"


@dataclass
class FakeGateway:
    """Answers `GET /v1/provider/connection` with `answer`, and keeps every request it is sent."""

    answer: dict[str, object]
    url: str = ""
    requests: list[bytes] = field(default_factory=list)

    async def connection(self, request: web.Request) -> web.Response:
        self.requests.append(f"{request.method} {request.path_qs} {dict(request.headers)}".encode()
                             + await request.read())
        return web.json_response(self.answer)


@contextlib.asynccontextmanager
async def serving(gateway: FakeGateway, tls: TlsFiles | None) -> AsyncIterator[FakeGateway]:
    app = web.Application()
    app.router.add_get(join.CONNECTION_PATH, gateway.connection)
    runner = web.AppRunner(app)
    await runner.setup()
    context = None
    if tls is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(tls.cert, tls.key)
    port = free_port()
    await web.TCPSite(runner, NETWORK_HOST, port, ssl_context=context).start()
    gateway.url = f"{'https' if tls else 'http'}://{NETWORK_HOST}:{port}"
    try:
        yield gateway
    finally:
        await runner.cleanup()


def ca_files(folder: Path) -> TlsFiles:
    """A CA and a certificate it signs for the gateway's host."""
    folder.mkdir()
    return write_tls_files(folder, (NETWORK_HOST,))


@pytest.fixture
def deployment_ca(tmp_path: Path) -> TlsFiles:
    return ca_files(tmp_path / "deployment")


@pytest.fixture
def other_ca(tmp_path: Path) -> TlsFiles:
    return ca_files(tmp_path / "other")


def answer(ca: TlsFiles | None, broker: str = f"tls://{NETWORK_HOST}:4222") -> dict[str, object]:
    pem = ca.ca.read_text() if ca else None
    return {"nats_urls": [broker], "tls_ca_pem": pem, "tls_ca_sha256": fingerprint(pem) if pem else None}


async def joined(url: str, data_dir: Path, pin: str | None) -> dict[str, str]:
    """The executor's environment as the join makes it (run off the loop: it asks the gateway synchronously)."""
    args = argparse.Namespace(deployment=url, worker_key=WORKER_KEY, data_dir=data_dir, executor_id="host-1",
                              ca_sha256=pin)
    env, _, _ = await asyncio.to_thread(join.executor_env, args, {})
    return env


async def refused(url: str, data_dir: Path, pin: str | None) -> str:
    with pytest.raises(SystemExit) as exited:
        await joined(url, data_dir, pin)
    assert not (data_dir / join.CA_FILE).exists()
    return str(exited.value)


async def test_the_genuine_gateway_is_trusted_by_its_pinned_ca(tmp_path: Path, deployment_ca: TlsFiles) -> None:
    async with serving(FakeGateway(answer(deployment_ca)), deployment_ca) as gateway:
        env = await joined(gateway.url, tmp_path / "host", fingerprint(deployment_ca.ca.read_text()))
    assert env["SHESHNAG_NATS_URL"] == f"tls://{NETWORK_HOST}:4222"
    assert env["SHESHNAG_NATS_TLS_CA"] == str((tmp_path / "host").resolve() / join.CA_FILE)


async def test_a_gateway_with_another_cas_certificate_is_refused_with_or_without_a_pin(
        tmp_path: Path, deployment_ca: TlsFiles, other_ca: TlsFiles) -> None:
    pin = fingerprint(deployment_ca.ca.read_text())
    # An impostor may hand out the deployment's CA (it is public), not a certificate that CA signed.
    async with serving(FakeGateway(answer(deployment_ca)), other_ca) as gateway:
        pinned = await refused(gateway.url, tmp_path / "host", pin)
        unpinned = await refused(gateway.url, tmp_path / "host", None)
    assert "did not prove who it is" in pinned and "--ca-sha256 pins" in pinned
    assert "pass --ca-sha256" in unpinned
    assert not any(WORKER_KEY.encode() in request for request in gateway.requests)


async def test_a_pin_with_an_answer_that_names_no_ca_is_refused(tmp_path: Path, deployment_ca: TlsFiles) -> None:
    async with serving(FakeGateway(answer(None)), deployment_ca) as gateway:
        message = await refused(gateway.url, tmp_path / "host", fingerprint(deployment_ca.ca.read_text()))
    assert "names no CA" in message


async def test_a_gateway_that_names_a_nats_broker_on_the_network_is_refused(
        tmp_path: Path, deployment_ca: TlsFiles) -> None:
    pin = fingerprint(deployment_ca.ca.read_text())
    async with serving(FakeGateway(answer(deployment_ca, f"nats://{NETWORK_HOST}:4222")), deployment_ca) as gateway:
        message = await refused(gateway.url, tmp_path / "host", pin)
    assert "not tls://" in message and "worker key was not sent" in message


async def test_a_plain_http_gateway_on_another_host_is_asked_nothing_and_its_broker_gets_nothing(
        tmp_path: Path) -> None:
    async with impostor_broker() as broker, serving(FakeGateway(answer(None, f"tls://{broker.url}")), None) as gateway:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "infra.cli", "executor", "--deployment", gateway.url, "--worker-key", WORKER_KEY,
            "--data-dir", str(tmp_path / "host"), stderr=asyncio.subprocess.PIPE)
        _, stderr = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode != 0 and "plain http to another host" in stderr.decode()
    assert gateway.requests == [] and broker.connections == 0
