"""A provider host joins with the gateway's URL and a worker key, nothing else: `sheshnag up --listen 127.0.0.2`
(an address other than 127.0.0.1 stands in for a network one) puts the broker behind TLS with the data dir's own
CA; `sheshnag executor --deployment … --worker-key wk-…`, in an environment of its own (no core broker
credentials, no S3 keys, its own data dir), learns broker and CA from the gateway, runs a batch over TLS and
presigned URLs, and is refused once its worker key is revoked."""

import asyncio
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2
import nats
import nats.errors
import pytest
from openai import OpenAI

from infra.embedded import free_port
from tests.e2e.conftest import ADMIN_KEY
from tests.e2e.test_batch_lifecycle import accounted
from tests.factories import chat_line, upload_when_key_known, wait_until_done

pytestmark = pytest.mark.e2e

HOST = "127.0.0.2"
EXECUTOR = "provider-host-1"


@dataclass
class Deployment:
    data_dir: Path
    gateway: str
    process: subprocess.Popen[bytes]

    def api(self, method: str, path: str, **kwargs: object) -> dict:
        response = httpx2.request(method, self.gateway + path, headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                                  timeout=30, **kwargs)  # type: ignore[arg-type]
        assert response.status_code < 300, response.text
        return response.json()


def wait_for(condition: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.3)
    raise TimeoutError(what)


def healthy(url: str) -> bool:
    try:
        return httpx2.get(url + "/healthz", timeout=1).status_code == 200
    except httpx2.HTTPError:
        return False


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    data_dir = tmp_path_factory.mktemp("listen") / "data"
    port = free_port()
    # The stack's own executor serves the embedding model alone: a chat batch can only run on the provider host.
    env = dict(os.environ, SHESHNAG_ADMIN_KEY=ADMIN_KEY, SHESHNAG_EXECUTOR_MODELS='["smollm2-135m-embed"]')
    out = (data_dir.parent / "up.out").open("ab")
    process = subprocess.Popen([sys.executable, "-m", "infra.cli", "up", "--data-dir", str(data_dir), "--port",
                                str(port), "--listen", HOST], env=env, stdout=out, stderr=subprocess.STDOUT)
    running = Deployment(data_dir, f"http://{HOST}:{port}", process)
    try:
        wait_for(lambda: process.poll() is not None or healthy(running.gateway), 120, "the stack did not come up")
        assert process.poll() is None, (data_dir.parent / "up.out").read_text()
        yield running
    finally:
        stop(process, signal.SIGINT, 60)


def stop(process: subprocess.Popen, sig: signal.Signals, grace_s: float) -> None:
    """Ask the process to stop with `sig`; killed if it has not within `grace_s`."""
    process.send_signal(sig)
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def worker_key(deployment: Deployment) -> dict:
    return deployment.api("POST", "/v1/provider/worker_keys", json={"name": "provider host"})


@pytest.fixture(scope="module")
def provider_host(deployment: Deployment, worker_key: dict,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The executor, from the one documented command, with nothing of the control plane's environment."""
    home = tmp_path_factory.mktemp("provider-host")
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "PYTHONUNBUFFERED": "1", "SHESHNAG_METRICS_PORT": "0",
           "SHESHNAG_EXECUTOR_CHUNK_LINES": "1"}
    log = (home / "executor.log").open("ab")
    process = subprocess.Popen([sys.executable, "-m", "infra.cli", "executor", "--deployment", deployment.gateway,
                                "--worker-key", worker_key["value"], "--data-dir", str(home / "sheshnag"),
                                "--executor-id", EXECUTOR], env=env, cwd=home, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield home
    finally:
        stop(process, signal.SIGTERM, 30)


def provider_row(deployment: Deployment) -> dict | None:
    rows = deployment.api("GET", "/v1/provider/executors")["data"]
    return next((row for row in rows if row["id"] == EXECUTOR), None)


def test_the_gateway_names_a_tls_broker_on_the_listen_address_and_its_ca(deployment: Deployment) -> None:
    answer = httpx2.get(deployment.gateway + "/v1/provider/connection", timeout=10).json()  # no key: public
    assert answer["nats_urls"] == [answer["nats_urls"][0]] and answer["nats_urls"][0].startswith(f"tls://{HOST}:")
    assert answer["tls_ca_pem"] == (deployment.data_dir / "tls" / "ca.pem").read_text()
    assert "core" not in answer["nats_urls"][0]


def test_a_provider_host_joins_runs_a_batch_and_is_refused_once_its_key_is_revoked(
        deployment: Deployment, worker_key: dict, provider_host: Path) -> None:
    log = provider_host / "executor.log"
    wait_for(lambda: (row := provider_row(deployment)) is not None and row["health"] == "live", 180,
             "the provider host's executor did not join")
    assert "broker CA sha256" in log.read_text() and (provider_host / "sheshnag" / "broker-ca.pem").exists()

    client = OpenAI(base_url=deployment.gateway + "/v1", api_key=ADMIN_KEY, max_retries=0, timeout=60)
    ids = ["first", "second"]
    file_id = upload_when_key_known(client, [chat_line(i, f"Say {i}.", max_tokens=8) for i in ids])
    created = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    batch, _ = wait_until_done(client, created.id, timeout_s=240)
    assert batch.status == "completed", batch.model_dump()
    accounted(client, batch, ids)
    row = provider_row(deployment)
    assert row is not None and row["lines_served"] == 2, row

    deployment.api("DELETE", f"/v1/provider/worker_keys/{worker_key['id']}")
    wait_for(lambda: (row := provider_row(deployment)) is None or row["health"] == "lost"
             or (row["heartbeat_age_s"] or 0) > 10, 90, "the revoked executor kept heartbeating")
    assert asyncio.run(refused(deployment, worker_key["value"]))


async def refused(deployment: Deployment, key: str) -> bool:
    """A connection as the provider's executor, over TLS to the advertised address, with the revoked key."""
    answer = httpx2.get(deployment.gateway + "/v1/provider/connection", timeout=10).json()
    tls = ssl.create_default_context(cadata=answer["tls_ca_pem"])
    try:
        connection = await nats.connect(answer["nats_urls"][0], user=EXECUTOR, password=key, tls=tls,
                                        allow_reconnect=False, connect_timeout=5, max_reconnect_attempts=0)
    except nats.errors.Error as error:
        return "authorization violation" in str(error).lower()
    await connection.close()
    return False
