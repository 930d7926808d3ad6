"""A provider host joins with the gateway's URL and a worker key, nothing else: `sheshnag up --listen 127.0.0.2`
(an address other than 127.0.0.1 stands in for a network one) puts broker, gateway and S3 behind TLS with the data
dir's own CA; `sheshnag executor --deployment https://… --ca-sha256 … --worker-key wk-…`, in an environment of its
own (no core broker credentials, no S3 keys, its own data dir), learns broker and CA from the gateway, runs a batch
over TLS and https presigned URLs, and is refused once its worker key is revoked. A packet capture on the listen
address meanwhile holds no plaintext HTTP or NATS and no key."""

import asyncio
import contextlib
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
from infra.tls import fingerprint
from tests.e2e.capture import Capture, can_capture
from tests.e2e.conftest import ADMIN_KEY
from tests.e2e.test_batch_lifecycle import accounted
from tests.factories import chat_line, upload_when_key_known, wait_until_done
from tests.support import engine_threads

pytestmark = pytest.mark.e2e

HOST = "127.0.0.2"
EXECUTOR = "provider-host-1"


@dataclass
class Deployment:
    data_dir: Path
    gateway: str
    process: subprocess.Popen[bytes]
    s3_port: int = 0
    ports: frozenset[int] = frozenset()
    """Gateway, broker and S3: what the stack serves on the listen address."""

    @property
    def ca(self) -> Path:
        return self.data_dir / "tls" / "ca.pem"

    def verify(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.ca)

    def api(self, method: str, path: str, **kwargs: object) -> dict:
        response = httpx2.request(method, self.gateway + path, headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                                  timeout=30, verify=self.verify(), **kwargs)  # type: ignore[arg-type]
        assert response.status_code < 300, response.text
        return response.json()


def wait_for(condition: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.3)
    raise TimeoutError(what)


def healthy(deployment: Deployment) -> bool:
    if not deployment.ca.exists():
        return False
    try:
        return httpx2.get(deployment.gateway + "/healthz", timeout=1, verify=deployment.verify()).status_code == 200
    except httpx2.HTTPError:
        return False


def admits_its_admin(deployment: Deployment) -> bool:
    """The stack's admin key works: it is folded into the read model after the gateway is up, a while later on a
    loaded machine (until then the key is unknown: 401)."""
    try:
        return httpx2.get(deployment.gateway + "/v1/me", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=5,
                          verify=deployment.verify()).status_code == 200
    except httpx2.HTTPError:
        return False


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    data_dir = tmp_path_factory.mktemp("listen") / "data"
    port = free_port()
    nats_port = free_port(frozenset({port}))
    s3_port = free_port(frozenset({port, nats_port}))
    # The stack's own executor serves the embedding model alone: a chat batch can only run on the provider host.
    env = dict(os.environ, SHESHNAG_ADMIN_KEY=ADMIN_KEY, SHESHNAG_EXECUTOR_MODELS='["smollm2-135m-embed"]')
    out = (data_dir.parent / "up.out").open("ab")
    process = subprocess.Popen([sys.executable, "-m", "infra.cli", "up", "--data-dir", str(data_dir), "--port",
                                str(port), "--nats-port", str(nats_port), "--s3-port",
                                str(s3_port), "--listen", HOST], env=env, stdout=out, stderr=subprocess.STDOUT)
    running = Deployment(data_dir, f"https://{HOST}:{port}", process, s3_port,
                         frozenset({port, nats_port, s3_port}))
    try:
        wait_for(lambda: process.poll() is not None or healthy(running), 120, "the stack did not come up")
        assert process.poll() is None, (data_dir.parent / "up.out").read_text()
        wait_for(lambda: admits_its_admin(running), 120, "the stack's admin key was never admitted")
        # `up` announces the stack (its state file) after its own wait for the admission, which asks ever more slowly.
        wait_for(lambda: (data_dir / "stack.json").exists(), 30, "the stack was never announced")
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
           "SHESHNAG_EXECUTOR_CHUNK_LINES": "1", "SHESHNAG_EXECUTOR_N_THREADS": engine_threads(),
           # The lines in hand when the module ends need not finish: the stop is the fixture's, not under test here.
           "SHESHNAG_EXECUTOR_STOP_GRACE_S": "3"}
    log = (home / "executor.log").open("ab")
    pin = fingerprint(deployment.ca.read_text())
    process = subprocess.Popen([sys.executable, "-m", "infra.cli", "executor", "--deployment", deployment.gateway,
                                "--worker-key", worker_key["value"], "--ca-sha256", pin,
                                "--data-dir", str(home / "sheshnag"),
                                "--executor-id", EXECUTOR], env=env, cwd=home, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield home
    finally:
        stop(process, signal.SIGTERM, 30)


def provider_row(deployment: Deployment) -> dict | None:
    rows = deployment.api("GET", "/v1/provider/executors")["data"]
    return next((row for row in rows if row["id"] == EXECUTOR), None)


def test_the_gateway_names_a_tls_broker_on_the_listen_address_and_its_ca(deployment: Deployment) -> None:
    answer = httpx2.get(deployment.gateway + "/v1/provider/connection", timeout=10,
                        verify=deployment.verify()).json()  # no key: public
    assert answer["nats_urls"] == [answer["nats_urls"][0]] and answer["nats_urls"][0].startswith(f"tls://{HOST}:")
    assert answer["tls_ca_pem"] == (deployment.data_dir / "tls" / "ca.pem").read_text()
    assert "core" not in answer["nats_urls"][0]


def test_a_provider_host_joins_runs_a_batch_and_is_refused_once_its_key_is_revoked(
        deployment: Deployment, worker_key: dict, provider_host: Path) -> None:
    log = provider_host / "executor.log"
    wait_for(lambda: (row := provider_row(deployment)) is not None and row["health"] == "live", 180,
             "the provider host's executor did not join")
    assert "broker CA sha256" in log.read_text() and (provider_host / "sheshnag" / "broker-ca.pem").exists()

    client = OpenAI(base_url=deployment.gateway + "/v1", api_key=ADMIN_KEY, max_retries=0, timeout=60,
                    http_client=httpx2.Client(verify=deployment.verify(), timeout=60))
    ids = ["first", "second"]
    with Capture(HOST) if can_capture() else contextlib.nullcontext() as wire:
        file_id = upload_when_key_known(client, [chat_line(i, f"Say {i} please.", max_tokens=8) for i in ids])
        created = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                        completion_window="24h")
        batch, _ = wait_until_done(client, created.id, timeout_s=240)
        assert batch.status == "completed", batch.model_dump()
        accounted(client, batch, ids)
    if wire is not None:
        nothing_in_clear(deployment, wire, [ADMIN_KEY, worker_key["value"], "Say first please"])
    row = provider_row(deployment)
    assert row is not None and row["lines_served"] == 2, row

    deployment.api("DELETE", f"/v1/provider/worker_keys/{worker_key['id']}")
    wait_for(lambda: (row := provider_row(deployment)) is None or row["health"] == "lost"
             or (row["heartbeat_age_s"] or 0) > 10, 90, "the revoked executor kept heartbeating")
    assert asyncio.run(refused(deployment, worker_key["value"]))


def nothing_in_clear(deployment: Deployment, wire: Capture, secrets: list[str]) -> None:
    """What crossed the listen address to and from gateway, broker and S3 was TLS records alone: no HTTP request
    or status line, no NATS protocol line, no key, no tenant text."""
    ours = [payload for source, destination, payload in wire.segments
            if source in deployment.ports or destination in deployment.ports]
    seen = {port for source, destination, _ in wire.segments for port in (source, destination)}
    assert deployment.ports <= seen, f"the capture saw no traffic on {sorted(deployment.ports - seen)}"
    wire_bytes = b"\n".join(ours)
    markers = [b"HTTP/1.", b"GET /", b"PUT /", b"POST /", b"CONNECT {", b"INFO {", b"PUB ", b"MSG ", b"PING\r\n",
               *(secret.encode() for secret in secrets)]
    assert [marker for marker in markers if marker in wire_bytes] == []
    assert all(payload[0] in (0x14, 0x15, 0x16, 0x17) for payload in ours), "a segment that is no TLS record"


def test_only_gateway_broker_and_s3_listen_on_the_listen_address(deployment: Deployment) -> None:
    listening = {int(row.split()[1].split(":")[1], 16) for row in Path("/proc/net/tcp").read_text().splitlines()[1:]
                 if row.split()[1].startswith("0200007F:") and row.split()[3] == "0A"}
    assert listening & deployment.ports == deployment.ports, "the stack's three do not all listen there"
    assert not listening & inner_ports(deployment), "an inner SeaweedFS port listens on the network address"
    s3_tls = httpx2.get(f"https://{HOST}:{deployment.s3_port}/", verify=deployment.verify(), timeout=10)
    assert s3_tls.status_code == 403 and b"AccessDenied" in s3_tls.content  # S3 itself, over verified TLS
    state = (deployment.data_dir / "stack.json").read_text()
    assert f'"gateway_url": "{deployment.gateway}"' in state


def inner_ports(deployment: Deployment) -> set[int]:
    """The ports of the running `weed mini` command line (master, volume, filer, admin, S3 and their gRPC)."""
    pid = int((deployment.data_dir / "logs" / "s3.pid").read_text())
    arguments = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return {int(arg.split(b"=")[1]) for arg in arguments if arg.startswith(b"-") and b".port" in arg
            and arg.split(b"=")[1].isdigit() and int(arg.split(b"=")[1]) > 0}


async def refused(deployment: Deployment, key: str) -> bool:
    """A connection as the provider's executor, over TLS to the advertised address, with the revoked key."""
    answer = httpx2.get(deployment.gateway + "/v1/provider/connection", timeout=10, verify=deployment.verify()).json()
    tls = ssl.create_default_context(cadata=answer["tls_ca_pem"])
    try:
        connection = await nats.connect(answer["nats_urls"][0], user=EXECUTOR, password=key, tls=tls,
                                        allow_reconnect=False, connect_timeout=5, max_reconnect_attempts=0)
    except nats.errors.Error as error:
        return "authorization violation" in str(error).lower()
    await connection.close()
    return False


def served_certificate(port: int) -> str:
    return ssl.get_server_certificate((HOST, port), timeout=10)


def test_certs_rotate_while_a_batch_runs_serves_the_new_certificate_everywhere_and_loses_no_line(
        deployment: Deployment) -> None:
    before = {port: served_certificate(port) for port in deployment.ports}
    client = OpenAI(base_url=deployment.gateway + "/v1", api_key=ADMIN_KEY, max_retries=0, timeout=60,
                    http_client=httpx2.Client(verify=deployment.verify(), timeout=60))
    ids = [f"line-{i}" for i in range(6)]
    lines = [{"custom_id": i, "method": "POST", "url": "/v1/embeddings",
              "body": {"model": "smollm2-135m-embed", "input": f"text {i}"}} for i in ids]
    file_id = upload_when_key_known(client, lines)  # type: ignore[arg-type]
    created = client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h")
    rotated = subprocess.run([sys.executable, "-m", "infra.cli", "certs", "rotate", "--data-dir",
                              str(deployment.data_dir)], capture_output=True, text=True, timeout=60)
    assert rotated.returncode == 0 and "now serves it" in rotated.stdout, rotated.stdout + rotated.stderr
    batch, _ = wait_until_done(client, created.id, timeout_s=120)
    assert batch.status == "completed", batch.model_dump()
    accounted(client, batch, ids)
    wait_for(lambda: all(served_certificate(port) != before[port] for port in deployment.ports), 10,
             "a server still serves the old certificate")
    assert {served_certificate(port) for port in deployment.ports} == {
        ssl.DER_cert_to_PEM_cert(ssl.PEM_cert_to_DER_cert((deployment.data_dir / "tls" / "server.pem").read_text()))}
    assert healthy(deployment)
