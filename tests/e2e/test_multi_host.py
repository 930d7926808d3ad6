"""docs/deployment.md's multi-host walkthrough, run as written: a CA and certificate from `sheshnag certs issue`, three
NATS nodes from `sheshnag nats-config` on 127.0.0.11-13 (TLS first on the client port, TLS routes), two of each
control-plane service with the env files the guide names (ledgers on PostgreSQL, one standing by), admin and worker
keys from `sheshnag keys create`, and an executor that joins with the gateway's https URL, a worker key and the CA's
pin alone. The node leading EVENTS is SIGKILLed mid-batch: every line ends exactly once, replay equals live."""

import asyncio
import secrets
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import nats
import psycopg
import pytest
from openai import OpenAI

from contracts.subjects import EVENTS_STREAM
from infra.embedded import S3Credentials, free_port, start_seaweed, stop_process
from infra.tls import fingerprint
from services.runtime.nats.client import server_list
from services.runtime.nats.tls import tls_options
from tests.deployment.backends import PostgresBackend, local_postgres
from tests.e2e.multi_host import HOSTS, SHESHNAG, Layout, host_env, read_env_file, until, write_env_file
from tests.factories import TERMINAL, chat_line, custom_ids_seen, lost_and_duplicated, upload_when_key_known
from tests.support import engine_threads

pytestmark = pytest.mark.e2e

CONTROL_PLANE = HOSTS[:2]
SERVICES = ("gateway", "validator", "scheduler", "ledger")


def postgres_schema() -> tuple[PostgresBackend, str]:
    """A schema of this test's own on the machine's PostgreSQL (the guide's ledger store); skipped without one."""
    backend, schema = local_postgres(), f"ledger_{secrets.token_hex(4)}"
    try:
        with psycopg.connect(**backend.params(), autocommit=True, connect_timeout=3) as db:  # type: ignore[arg-type]
            db.execute(f"CREATE SCHEMA {schema}")
    except psycopg.OperationalError as error:
        pytest.skip(f"PostgreSQL is not reachable at {backend.host}:{backend.port}: {error}")
    return backend, schema


def control_plane_env(layout: Layout, host: str, gateway_port: int, s3_endpoint: str, postgres: PostgresBackend,
                      schema: str) -> Path:
    """`/etc/sheshnag/control-plane.env` of one host, systemd/control-plane.env.example's keys with this layout's
    values."""
    example = read_env_file(Path(__file__).parents[2] / "infra" / "deploy" / "systemd" / "control-plane.env.example")
    values = {**example, "SHESHNAG_NATS_TLS_CA": str(layout.tls / "ca.pem"), "SHESHNAG_S3_ENDPOINT": s3_endpoint,
              "SHESHNAG_GATEWAY_HOST": host, "SHESHNAG_GATEWAY_PORT": str(gateway_port),
              "SHESHNAG_GATEWAY_TLS_CERT": str(layout.tls / "server.pem"),
              "SHESHNAG_GATEWAY_TLS_KEY": str(layout.tls / "server-key.pem"),
              "SHESHNAG_SCHEDULER_OBJECT_URL_ENDPOINT": s3_endpoint, "SHESHNAG_LEDGER_STANDBY": "true",
              "SHESHNAG_LEDGER_POSTGRES_DBNAME": postgres.dbname, "SHESHNAG_LEDGER_POSTGRES_HOST": postgres.host,
              "SHESHNAG_LEDGER_POSTGRES_PORT": str(postgres.port), "SHESHNAG_LEDGER_POSTGRES_USER": postgres.user,
              "SHESHNAG_LEDGER_POSTGRES_SCHEMA": schema, "SHESHNAG_METRICS_ADDRESS": host,
              **{f"SHESHNAG_{name}_METRICS_PORT": "0" for name in ("VALIDATOR", "SCHEDULER", "LEDGER")}}
    return write_env_file(layout.root / f"control-plane-{host}.env", values)


def service_envs(layout: Layout, s3: S3Credentials, postgres: PostgresBackend) -> dict[str, Path]:
    """`/etc/sheshnag/<service>.env`: each service's own secrets, as the guide's step 3 lists them."""
    keys = {"SHESHNAG_S3_ACCESS_KEY": s3.access_key, "SHESHNAG_S3_SECRET_KEY": s3.secret_key}
    callout = read_env_file(layout.secrets / "callout.env")
    return {name: write_env_file(layout.root / f"{name}.env", values) for name, values in {
        "gateway": keys, "validator": keys, "scheduler": {**keys, **callout},
        "ledger": {"SHESHNAG_LEDGER_POSTGRES_PASSWORD": postgres.password}}.items()}


class Deployment:
    def __init__(self, layout: Layout, gateway_port: int, postgres: PostgresBackend, schema: str) -> None:
        self.layout, self.gateway_port, self.postgres, self.schema = layout, gateway_port, postgres, schema
        self.core = read_env_file(layout.secrets / "core.env")["SHESHNAG_NATS_URL"]

    def gateway(self, host: str) -> str:
        return f"https://{host}:{self.gateway_port}"

    def verify(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.layout.tls / "ca.pem")

    def client(self, host: str, api_key: str) -> OpenAI:
        return OpenAI(base_url=self.gateway(host) + "/v1", api_key=api_key, max_retries=5, timeout=60,
                      http_client=httpx2.Client(verify=self.verify(), timeout=60))

    def answers(self, host: str) -> bool:
        try:
            return httpx2.get(self.gateway(host) + "/healthz", timeout=1, verify=self.verify()).status_code == 200
        except httpx2.HTTPError:
            return False

    def events_leader(self) -> str | None:
        return asyncio.run(self._events_leader())

    async def _events_leader(self) -> str | None:
        ca = self.layout.tls / "ca.pem"
        try:
            nc = await nats.connect(server_list(self.core), allow_reconnect=False, connect_timeout=2,
                                    **tls_options(self.core, ca))
        except (nats.errors.Error, OSError):
            return None
        try:
            cluster = (await nc.jetstream(timeout=2).stream_info(EVENTS_STREAM)).cluster
            return cluster.leader if cluster else None
        except (nats.errors.Error, nats.js.errors.Error):
            return None
        finally:
            await nc.close()


@pytest.fixture
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """Made afresh for each try (a rerun gets a whole deployment, not the one the failed try left)."""
    postgres, schema = postgres_schema()
    layout = Layout.plan(tmp_path_factory.mktemp("multi-host"))
    s3_dir = layout.root / "s3"
    s3_dir.mkdir()
    s3, s3_port = S3Credentials.load_or_create(s3_dir / "s3-credentials.json"), free_port()
    while s3_port + 10000 > 65535:  # SeaweedFS's S3 also listens on its port + 10000 (gRPC)
        s3_port = free_port()
    seaweed = None
    try:
        layout.configure_nats()
        for node in layout.nodes:
            layout.start_node(node)
        seaweed = start_seaweed(s3_dir, s3_port, s3, s3_dir / "weed.log")  # MinIO's stand-in, behind its one name
        until(lambda: all(layout.healthy(node) for node in layout.nodes), 60,
              lambda: "the cluster elected no meta leader: " + layout.log("nats-1")[-1500:])
        running = Deployment(layout, free_port(frozenset({s3_port})), postgres, schema)
        own = service_envs(layout, s3, postgres)
        for host in CONTROL_PLANE:
            shared = control_plane_env(layout, host, running.gateway_port, f"127.0.0.1:{s3_port}", postgres, schema)
            for name in SERVICES:
                layout.start(f"{name}@{host}", [SHESHNAG, name],
                             host_env(shared, layout.secrets / "core.env", own[name]))
        yield running
    finally:
        layout.stop()
        if seaweed is not None:
            stop_process(seaweed)
        with psycopg.connect(**postgres.params(), autocommit=True) as db:  # type: ignore[arg-type]
            db.execute(f"DROP SCHEMA {schema} CASCADE")


def keys(deployment: Deployment) -> tuple[str, str]:
    """An admin key and a worker key, from `sheshnag keys create` with a control-plane host's environment."""
    layout, host = deployment.layout, CONTROL_PLANE[0]
    env = host_env(layout.root / f"control-plane-{host}.env", layout.secrets / "core.env")
    admin = layout.sheshnag("keys", "create", "--role", "admin", "--label", "operator", env=env).strip()
    worker = layout.sheshnag("keys", "create", "--role", "worker", "--label", "gpu-1", env=env).strip()
    return admin, worker


def join(deployment: Deployment, worker_key: str) -> None:
    """The provider host: `sheshnag executor --deployment https://… --worker-key … --ca-sha256 …` and nothing else
    of the control plane's (no core credentials, no S3 keys, no CA file)."""
    home = deployment.layout.root / "executor-host"
    home.mkdir()
    pin = fingerprint((deployment.layout.tls / "ca.pem").read_text())
    env = {**host_env(), "HOME": str(home), "SHESHNAG_METRICS_PORT": "0", "SHESHNAG_EXECUTOR_CHUNK_LINES": "1",
           "SHESHNAG_EXECUTOR_MODELS": '["smollm2"]', "SHESHNAG_EXECUTOR_WORKER_KEY": worker_key,
           "SHESHNAG_EXECUTOR_N_THREADS": engine_threads()}
    deployment.layout.start("executor", [SHESHNAG, "executor", "--deployment", deployment.gateway(CONTROL_PLANE[0]),
                                         "--ca-sha256", pin, "--data-dir", str(home / "sheshnag"),
                                         "--executor-id", "gpu-1"], env)


def test_the_documented_multi_host_layout_runs_a_batch_through_the_sigkill_of_the_node_leading_events(
        deployment: Deployment) -> None:
    layout, started = deployment.layout, time.monotonic()
    until(lambda: all(deployment.answers(host) for host in CONTROL_PLANE), 90,
          lambda: "a gateway did not answer over https: " + layout.log(f"gateway@{CONTROL_PLANE[0]}")[-1500:])
    admin_key, worker_key = keys(deployment)
    join(deployment, worker_key)
    keys_s = time.monotonic() - started
    ids = [f"multi-host-{i}" for i in range(6)]
    client = deployment.client(CONTROL_PLANE[0], admin_key)
    created = client.batches.create(
        input_file_id=upload_when_key_known(client, [chat_line(custom_id, f"Count to {i + 3}.", max_tokens=8)
                                                     for i, custom_id in enumerate(ids)]),
        endpoint="/v1/chat/completions", completion_window="24h")
    until(lambda: client.batches.retrieve(created.id).status in ("in_progress", "finalizing", "completed"), 120,
          lambda: "the batch never ran: " + layout.log("executor")[-2000:])
    up_s = time.monotonic() - started
    print(f"\nkeys made and executor started {keys_s:.1f}s in; the batch runs {up_s:.1f}s in")

    leader = deployment.events_leader()
    assert leader is not None
    killed_at = time.monotonic()
    layout.kill(leader)
    other = deployment.client(CONTROL_PLANE[1], admin_key)  # the batch is read through the other gateway
    until(lambda: not layout.restart_exited() and other.batches.retrieve(created.id).status in TERMINAL, 120,
          lambda: "the batch did not end: " + layout.log("executor")[-2000:])
    batch = other.batches.retrieve(created.id)
    lost, duplicated = lost_and_duplicated(ids, custom_ids_seen(other, batch))
    print(f"\nup and running in {up_s:.1f}s; killed {leader}; batch {batch.status} "
          f"{time.monotonic() - killed_at:.1f}s after the kill; {lost} lost, {duplicated} duplicated; restarted by "
          f"their units: {layout.restarts or 'none'}")
    assert batch.status == "completed", batch.model_dump()
    assert (lost, duplicated) == (0, 0)

    units = [f"{name}@{host}" for name in ("scheduler", "ledger") for host in CONTROL_PLANE]
    logs = {unit: layout.log(unit) for unit in units}
    assert "broker CA sha256" in layout.log("executor")
    assert all("is the leader" in log or "stands by" in log for log in logs.values()), logs
    host = CONTROL_PLANE[0]
    layout.sheshnag("ledger", "replay", env=host_env(layout.root / f"control-plane-{host}.env",
                                                     layout.secrets / "core.env", layout.root / "ledger.env"))
