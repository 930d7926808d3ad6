"""A JetStream cluster of nats-servers on this machine's loopback, as `infra/embedded.py` runs one: each node's
config (`sheshnag nats-config`'s: the embedded broker's accounts and auth callout, password-protected routes to
the other nodes, a store of its own) and process.

For trying, and testing, a clustered control plane on one host: start it in a data dir, then `sheshnag up
--data-dir DIR --nats-url <its urls()>` with `SHESHNAG_NATS_REPLICAS=3` runs the services against it (they share
the data dir's `nats-auth.json`). Nodes keep their names and ports across a restart, so a killed node rejoins
as itself and catches up.
"""

import json
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from infra.embedded import NATS_READY_S, free_port, launch, stop_process, venv_binary, wait_for_port
from infra.nats_auth import CORE_USER, NatsAuth
from infra.nats_config import Cluster, ServerLayout, server_config
from infra.private import write_private

CLUSTER_NAME = "sheshnag"
NODES_DIR = "nats-cluster"
READY_S = 30.0
"""How long a started cluster may take to elect its JetStream meta leader (each node's /healthz says ok)."""


@dataclass(frozen=True)
class ClusterNode:
    client_port: int
    route_port: int
    monitor_port: int
    """`/healthz` on loopback: whether this node has JetStream and knows the cluster's meta leader."""

    @property
    def name(self) -> str:
        """Its server name, as stream info's `cluster.leader` names it."""
        return f"sheshnag-{self.client_port}"


@dataclass
class NatsCluster:
    data_dir: Path
    nodes: tuple[ClusterNode, ...]
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @classmethod
    def plan(cls, data_dir: Path, size: int = 3) -> "NatsCluster":
        """`size` nodes on free loopback ports; nothing starts until `start`."""
        taken: set[int] = set()
        nodes = []
        for _ in range(size):
            ports = []
            for _ in range(3):
                ports.append(free_port(frozenset(taken)))
                taken.add(ports[-1])
            nodes.append(ClusterNode(*ports))
        return cls(data_dir, tuple(nodes))

    @property
    def auth(self) -> NatsAuth:
        """The data dir's broker secrets, made on first use: the services started on this data dir use them too."""
        return NatsAuth.load_or_create(self.data_dir)

    def urls(self, user: str | None = None, password: str | None = None) -> str:
        """Every node's client URL, comma-separated (`SHESHNAG_NATS_URL`, `up --nats-url`), with credentials if
        given."""
        credentials = f"{user}:{password}@" if user and password else ""
        return ",".join(f"nats://{credentials}127.0.0.1:{node.client_port}" for node in self.nodes)

    def core_urls(self) -> str:
        """The URLs with the core user's credentials: what the five services connect with."""
        return self.urls(CORE_USER, self.auth.core_password)

    def node(self, name: str) -> ClusterNode:
        return next(node for node in self.nodes if node.name == name)

    def start(self) -> None:
        """Write every node's config and start them all; returns once each reports JetStream healthy."""
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        (self.data_dir / "logs").mkdir(mode=0o700, exist_ok=True)
        for node in self.nodes:
            self.start_node(node.name, wait=False)
        for node in self.nodes:
            self.wait_healthy(node)

    def start_node(self, name: str, wait: bool = True) -> None:
        """Start (or restart, on its ports and store) one node."""
        node = self.node(name)
        process = launch([venv_binary("nats-server"), "-c", str(self._write_config(node))],
                         self.data_dir / "logs" / f"{node.name}.log")
        self.processes[name] = process
        wait_for_port(node.client_port, process, NATS_READY_S, f"nats-server {name}")
        if wait:
            self.wait_healthy(node)

    def kill(self, name: str) -> None:
        """SIGKILL one node, as a crash would stop it."""
        process = self.processes.pop(name)
        process.kill()
        process.wait()

    def stop(self) -> None:
        for name in list(self.processes):
            stop_process(self.processes.pop(name))

    def wait_healthy(self, node: ClusterNode, within_s: float = READY_S) -> None:
        deadline = time.monotonic() + within_s
        answer = ""
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{node.monitor_port}/healthz", timeout=1) as reply:
                    if json.loads(reply.read()).get("status") == "ok":
                        return
            except urllib.error.HTTPError as error:
                answer = error.read().decode(errors="replace")
            except OSError as error:
                answer = repr(error)
            time.sleep(0.1)
        raise TimeoutError(f"nats-server {node.name} not healthy within {within_s}s: {answer}")

    def _write_config(self, node: ClusterNode) -> Path:
        directory = self.data_dir / NODES_DIR
        store = directory / node.name
        store.mkdir(mode=0o700, parents=True, exist_ok=True)
        cluster = Cluster(CLUSTER_NAME, tuple(f"127.0.0.1:{other.route_port}" for other in self.nodes),
                          listen=f"127.0.0.1:{node.route_port}")
        layout = ServerLayout(node.name, listen=f"127.0.0.1:{node.client_port}", store_dir=str(store),
                              cluster=cluster, monitor=f"127.0.0.1:{node.monitor_port}")
        path = directory / f"{node.name}.conf"
        write_private(path, server_config(self.auth, layout).encode())
        return path
