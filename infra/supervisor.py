"""The embedded default: broker, object store and the five services as supervised OS processes."""

import asyncio
import contextlib
import logging
import os
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from infra.broker_watch import BrokerWatch, jetstream_limits
from infra.embedded import (
    NATS_READY_S,
    S3_READY_S,
    S3Credentials,
    ServerMetrics,
    free_port,
    nats_command,
    seaweed_command,
    storage_paths,
    tighten_volume_info,
    url_host,
    wait_for_port,
)
from infra.nats_auth import NatsAuth
from infra.nats_config import client_tls, core_url
from infra.object_store_watch import ObjectStoreWatch, probe_client
from infra.private import make_private
from infra.process_env import StackSecrets, server_env, service_env
from infra.service_names import SERVICES
from infra.supervised import Supervised, start_until_listening
from infra.tls import ServerTls, ensure_server_tls
from services.runtime.nats.tls import is_local_host
from services.runtime.process.runner import SUPERVISOR_PID
from services.runtime.process.settings import ConnectionSettings

log = logging.getLogger("sheshnag.up")

STOP_ORDER = (("gateway", "executor"), ("scheduler", "validator", "ledger"))
"""How `up` stops its services, a group at a time (the servers after them): an executor's last facts still reach the
scheduler's desk and the ledger."""
WEBHOOK_CIDRS = "SHESHNAG_GATEWAY_WEBHOOK_ALLOWED_CIDRS"
LOOPBACK_CIDRS = "127.0.0.0/8,::1/128"


@dataclass
class Stack:
    data_dir: Path
    gateway_port: int
    nats_port: int
    s3_port: int
    nats_urls: str = ""
    """An existing broker to use instead of starting one: a cluster's client URLs, comma-separated, without
    credentials. Its accounts must be this data dir's (`nats-auth.json`, as `infra/nats_cluster.py` writes them)."""
    listen: str = "127.0.0.1"
    """The address the broker, the object store and the gateway bind, and that remote executors are told to use.
    Anything but loopback puts all three behind TLS, with one certificate signed by the data dir's own CA; the
    object store's inner servers stay on loopback (S3 reaches the network through `infra/tls_relay.py`)."""
    webhooks_to_loopback: bool = False
    """`up --webhooks-to-loopback`: webhooks may go to this host's loopback (a local receiver), besides public
    addresses and whatever `SHESHNAG_GATEWAY_WEBHOOK_ALLOWED_CIDRS` allows."""
    credentials: S3Credentials = field(init=False)
    nats_auth: NatsAuth = field(init=False)
    worker_key: str = ""
    tls: ServerTls | None = None
    s3_inner_port: int = 0
    """Behind TLS: SeaweedFS's own S3 port, on loopback, that the services and the relay reach."""
    children: list[Supervised] = field(default_factory=list)
    """Broker and object store first, then the services; stopped in reverse order."""
    broker_watch: BrokerWatch | None = None
    """The stack's own broker, restarted once space returns after its disk filled (infra/broker_watch.py)."""
    object_store_watch: ObjectStoreWatch | None = None
    """The stack's own object store, restarted when it goes on refusing writes after space returned
    (infra/object_store_watch.py)."""

    @property
    def logs(self) -> Path:
        return self.data_dir / "logs"

    @property
    def uses_tls(self) -> bool:
        """Whether the stack's own broker is behind TLS."""
        return not self.nats_urls and self.serves_network

    @property
    def serves_network(self) -> bool:
        """Whether gateway and object store serve an address other than 127.0.0.1, localhost or ::1 (127.0.0.2, what
        tests stand in for a network address with, included): then over HTTPS alone, and the broker behind TLS."""
        return not is_local_host(self.listen)

    def gateway_url(self) -> str:
        scheme = "https" if self.serves_network else "http"
        return f"{scheme}://{url_host(self.listen)}:{self.gateway_port}"

    def nats_url(self) -> str:
        """The broker's URL(s) without credentials: what the services and executors are given."""
        if self.nats_urls:
            return self.nats_urls
        return f"{'tls' if self.uses_tls else 'nats'}://{url_host(self.listen)}:{self.nats_port}"

    def core_nats_url(self) -> str:
        """The broker's URL(s) with the core user's credentials in each."""
        return core_url(self.nats_auth, self.nats_url())

    def secrets(self) -> StackSecrets:
        return StackSecrets(core_nats_url=self.core_nats_url(),
                            executor_nats_url=self.nats_url(),
                            s3_access_key=self.credentials.access_key, s3_secret_key=self.credentials.secret_key,
                            callout_seed=self.nats_auth.issuer_seed, worker_key=self.worker_key)

    def s3_endpoint(self) -> str:
        """Where the services (and `up`'s own probe) reach S3: behind TLS, SeaweedFS's own port on loopback."""
        return f"127.0.0.1:{self.s3_inner_port}" if self.s3_inner_port else f"{url_host(self.listen)}:{self.s3_port}"

    def settings_env(self) -> dict[str, str]:
        """The stack's wiring every service gets; none of it is secret."""
        tls = {"SHESHNAG_NATS_TLS_CA": str(self.tls.ca)} if self.tls and self.uses_tls else {}
        return {
            **tls,
            **self.https_env(),
            "SHESHNAG_S3_ENDPOINT": self.s3_endpoint(),
            "SHESHNAG_GATEWAY_HOST": self.listen,
            "SHESHNAG_GATEWAY_PORT": str(self.gateway_port),
            "SHESHNAG_GATEWAY_PROVIDER_NATS_URL": self.nats_url(),
            **({WEBHOOK_CIDRS: ",".join(filter(None, (os.environ.get(WEBHOOK_CIDRS), LOOPBACK_CIDRS)))}
               if self.webhooks_to_loopback else {}),
            "SHESHNAG_LEDGER_DB_PATH": str(self.data_dir / "ledger.sqlite"),
            "SHESHNAG_STORAGE_PATHS": storage_paths(self.data_dir, own_broker=not self.nats_urls),
            "SHESHNAG_EXECUTOR_EXECUTOR_ID": os.environ.get("SHESHNAG_EXECUTOR_EXECUTOR_ID", "local-0"),
            "PYTHONUNBUFFERED": "1",
        }

    def https_env(self) -> dict[str, str]:
        """Behind TLS: the gateway's certificate (the stack's, unless the operator names one), the services' S3 on
        loopback, and presigned URLs naming the relay's https:// endpoint, verified against the stack's CA."""
        if self.tls is None:
            return {}
        own = {name: os.environ[name] for name in ("SHESHNAG_GATEWAY_TLS_CERT", "SHESHNAG_GATEWAY_TLS_KEY")
               if os.environ.get(name)}
        return {"SHESHNAG_GATEWAY_TLS_CERT": str(self.tls.cert), "SHESHNAG_GATEWAY_TLS_KEY": str(self.tls.key), **own,
                "SHESHNAG_S3_TLS_CA": str(self.tls.ca),
                "SHESHNAG_SCHEDULER_OBJECT_URL_ENDPOINT": f"https://{url_host(self.listen)}:{self.s3_port}"}

    def start_infra(self) -> None:
        """Broker and object store, supervised like the services: a crashed one restarts on the same
        ports and data, and the services reconnect."""
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        make_private(self.data_dir)
        self.logs.mkdir(mode=0o700, exist_ok=True)
        self.credentials = S3Credentials.load_or_create(self.data_dir / "s3-credentials.json")
        self.nats_auth = NatsAuth.load_or_create(self.data_dir)
        if self.serves_network:
            self.tls = ensure_server_tls(self.data_dir, [self.listen])
        tls = ""
        if self.tls and self.uses_tls:
            # The name in the config too: else a reload (SIGHUP, certs rotate) is refused as changing the name.
            tls = f'server_name: "sheshnag-{self.nats_port}"\n' + client_tls(str(self.tls.cert), str(self.tls.key))
        connection = ConnectionSettings()
        metrics = server_metrics(connection)
        nats_config = self.nats_auth.write_server_config(self.data_dir, tls + jetstream_limits(self.data_dir)
                                                         + metrics.broker_config())
        # Neither server needs a secret from the environment: each reads its own from 0600 files.
        infra_env = server_env(os.environ)
        servers = []
        if not self.nats_urls:  # else the operator runs the broker
            command = nats_command(self.data_dir, self.nats_port, nats_config, self.listen)
            servers.append((Supervised("nats-server", command, infra_env, self.logs / "nats.log"), self.nats_port,
                            NATS_READY_S, self.listen))
            self.broker_watch = BrokerWatch(self.data_dir / "nats", self.logs / "nats.log",
                                            None if self.uses_tls else self.core_nats_url(),
                                            connection.storage_reserve_percent, connection.storage_reserve_max_bytes)
        promised = frozenset({self.gateway_port, self.nats_port})
        if self.tls is None:
            def s3_command() -> list[str]:
                return seaweed_command(self.data_dir, self.s3_port, self.credentials, promised, self.listen, metrics)
            servers.append((Supervised("s3", [], infra_env, self.logs / "s3.log", cwd=self.data_dir / "s3",
                                       make_command=s3_command), self.s3_port, S3_READY_S, self.listen))
        else:
            promised |= {self.s3_port}
            inner = self.s3_inner_port = free_port(promised)

            def s3_command() -> list[str]:
                return seaweed_command(self.data_dir, inner, self.credentials, promised | {inner}, metrics=metrics)
            relay = [sys.executable, "-m", "infra.tls_relay", self.listen, str(self.s3_port),
                     str(self.s3_inner_port), str(self.tls.cert), str(self.tls.key)]
            servers += [(Supervised("s3", [], infra_env, self.logs / "s3.log", cwd=self.data_dir / "s3",
                                    make_command=s3_command), self.s3_inner_port, S3_READY_S, "127.0.0.1"),
                        (Supervised("s3-tls", relay, infra_env, self.logs / "s3-tls.log"), self.s3_port, S3_READY_S,
                         self.listen)]
        for child, port, ready_s, host in servers:
            start_until_listening(child, port, ready_s, host)
            self.children.append(child)
        self.object_store_watch = ObjectStoreWatch(
            self.data_dir / "s3",
            probe_client(self.s3_endpoint(), self.credentials.access_key, self.credentials.secret_key),
            connection.s3_bucket, connection.storage_reserve_percent, connection.storage_reserve_max_bytes)

    def start_services(self) -> None:
        secrets, settings = self.secrets(), self.settings_env()
        base = ConnectionSettings().metrics_port
        for index, name in enumerate(SERVICES):
            env = {**metrics_env(service_env(name, os.environ, secrets, settings), base, index),
                   SUPERVISOR_PID: str(os.getpid())}  # a service stops once this process is gone
            child = Supervised(name, [sys.executable, "-m", f"services.{name}"], env, self.logs / f"{name}.log")
            child.start()
            self.children.append(child)

    async def supervise(self, stop: asyncio.Event) -> None:
        """Every half second: restart what crashed, run the watches. A tick that fails is logged and the next one
        runs: the supervisor stopping would stop every server of the stack."""
        while not stop.is_set():
            try:
                await self._tick()
            except Exception:
                log.exception("a supervisor tick failed; the next one runs in 0.5 s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=0.5)
        if self.broker_watch is not None:
            await self.broker_watch.close()
        if self.object_store_watch is not None:
            self.object_store_watch.close()

    async def _tick(self) -> None:
        for child in self.children:
            child.check()
        await self.watch_broker()
        await self.watch_object_store()
        try:
            tighten_volume_info(self.data_dir / "s3")
        except OSError as error:  # a volume info file SeaweedFS is replacing: the next tick sees it
            log.warning("volume info files not tightened: %s", error)

    async def watch_broker(self) -> None:
        broker = self._child("nats-server")
        if self.broker_watch is None or broker is None or broker.process is None:
            return

        def ready() -> None:
            assert broker.process is not None
            wait_for_port(self.nats_port, broker.process, NATS_READY_S, broker.name, self.listen)

        try:
            await self.broker_watch.check(broker, ready)
        except (OSError, RuntimeError, TimeoutError) as error:
            log.error("the broker's watch failed: %r; it looks again next tick", error)

    async def watch_object_store(self) -> None:
        s3 = self._child("s3")
        if self.object_store_watch is None or s3 is None or s3.process is None:
            return
        port, host = (self.s3_inner_port, "127.0.0.1") if self.s3_inner_port else (self.s3_port, self.listen)

        def ready() -> None:
            start_until_listening(s3, port, S3_READY_S, host, started=True)

        try:
            await self.object_store_watch.check(s3, ready)
        except (OSError, RuntimeError, TimeoutError) as error:
            log.error("the object store's watch failed: %r; it looks again next tick", error)

    def _child(self, name: str) -> Supervised | None:
        return next((child for child in self.children if child.name == name), None)

    def reload_certificates(self) -> None:
        """Have every server of the stack that serves its certificate load it again (after `certs rotate`): the
        broker reloads its config on SIGHUP, the gateway and the S3 relay reload their TLS contexts; connections
        open stay as they are. A gateway with the operator's own certificate reloads that one."""
        if self.tls is None:
            return
        for child in self.children:
            if child.name in ("nats-server", "gateway", "s3-tls") and child.process and child.process.poll() is None:
                child.process.send_signal(signal.SIGHUP)
        log.info("certificates reloaded from %s", self.tls.cert.parent)

    def stop(self) -> None:
        """In `STOP_ORDER`, each group's processes together: the edges (new work stops coming), the services they
        talk to, then the servers every service used."""
        named = {child.name: child for child in self.children}
        groups = [[named.pop(name) for name in group if name in named] for group in STOP_ORDER]
        for group in [*groups, list(reversed(named.values()))]:
            if group:
                with ThreadPoolExecutor(len(group), thread_name_prefix="stop") as stopping:
                    list(stopping.map(Supervised.stop, group))


def metrics_env(env: dict[str, str], base: int, index: int) -> dict[str, str]:
    """A metrics base port P (`SHESHNAG_METRICS_PORT`, from the environment or the settings file) gives each service
    of `up` its own: P for the first, P+1 for the next, …"""
    return {**env, "SHESHNAG_METRICS_PORT": str(base + index)} if base else env


def server_metrics(connection: ConnectionSettings) -> ServerMetrics:
    """Where the embedded servers' own metrics are served, after the services' ports (`metrics_env`): S3's
    Prometheus metrics at P+5, bound to the metrics address like the services', and the broker's monitoring
    endpoint (`/varz`, `/connz`, `/jsz`) at P+6 on loopback only; none without a base port."""
    base = connection.metrics_port
    if not base:
        return ServerMetrics()
    return ServerMetrics(connection.metrics_address, base + len(SERVICES), base + len(SERVICES) + 1)


