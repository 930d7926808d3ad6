"""The multi-host layout of docs/deployment.md ("Hosts with systemd"), built with the commands it shows: three NATS
hosts and two control-plane hosts stand on loopback addresses other than 127.0.0.1 (so the network's rule holds:
`tls://`, verified against the deployment's CA, TLS first; routes over TLS), each process started as its unit
would be, with the environment of its env files and nothing else."""

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx2

from infra.embedded import free_port, launch, stop_process, wait_for_port

HOSTS = ("127.0.0.11", "127.0.0.12", "127.0.0.13")
"""nats-1, nats-2, nats-3; the first two are the control-plane hosts as well."""
SHESHNAG = str(Path(sys.executable).parent / "sheshnag")
NATS_SERVER = str(Path(sys.executable).parent / "nats-server")


def read_env_file(path: Path) -> dict[str, str]:
    """`KEY=value` lines as systemd's EnvironmentFile reads them (comments and blank lines skipped)."""
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if line.strip() and not line.startswith("#"))
    return {key.strip(): value.strip() for key, value in pairs}


def write_env_file(path: Path, values: dict[str, str]) -> Path:
    path.write_text("".join(f"{key}={value}\n" for key, value in values.items()))
    path.chmod(0o600)
    return path


def host_env(*files: Path, **extra: str) -> dict[str, str]:
    """A unit's environment: its env files over a bare PATH and HOME, no SHESHNAG_* of the test's own."""
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), "PYTHONUNBUFFERED": "1"}
    for file in files:
        env.update(read_env_file(file))
    return {**env, **extra}


def until(condition: Callable[[], object], within_s: float, what: Callable[[], str]) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what())
        time.sleep(0.2)


@dataclass(frozen=True)
class NatsNode:
    name: str
    host: str
    client_port: int
    route_port: int
    monitor_port: int

    @property
    def url(self) -> str:
        return f"tls://{self.host}:{self.client_port}"


@dataclass
class Layout:
    root: Path
    nodes: tuple[NatsNode, ...]
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    units: dict[str, tuple[list[str], dict[str, str]]] = field(default_factory=dict)
    """What each service was started with, to start it again as its unit's `Restart=always` does."""
    restarts: list[str] = field(default_factory=list)

    @classmethod
    def plan(cls, root: Path) -> "Layout":
        taken: set[int] = set()
        nodes = []
        for index, host in enumerate(HOSTS, start=1):
            ports = [free_port(frozenset(taken)) for _ in range(3)]
            taken.update(ports)
            nodes.append(NatsNode(f"nats-{index}", host, *ports))
        return cls(root, tuple(nodes))

    @property
    def secrets(self) -> Path:
        """The operator's folder: `nats-auth/`, `tls/`, `core.env`, `callout.env`."""
        return self.root / "deploy-secrets"

    @property
    def tls(self) -> Path:
        return self.secrets / "tls"

    @property
    def urls(self) -> str:
        return ",".join(node.url for node in self.nodes)

    def log(self, name: str) -> str:
        path = self.root / "logs" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def sheshnag(self, *args: str, env: dict[str, str] | None = None) -> str:
        done = subprocess.run([SHESHNAG, *args], capture_output=True, text=True, timeout=120,
                              env=env or host_env(), cwd=self.root)
        assert done.returncode == 0, f"sheshnag {args[0]}: {done.stdout}{done.stderr}"
        return done.stdout

    def configure_nats(self) -> None:
        """The guide's steps 1 and 2: the CA and certificate, then each node's config (and the env files)."""
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        self.sheshnag("certs", "issue", "--data-dir", str(self.secrets), "--names", *HOSTS)
        routes = ",".join(f"{node.host}:{node.route_port}" for node in self.nodes)
        for node in self.nodes:
            self.sheshnag(
                "nats-config", "--data-dir", str(self.secrets / "nats-auth"), "--out", str(self.config(node)),
                "--server-name", node.name, "--listen", f"{node.host}:{node.client_port}",
                "--cluster-name", "sheshnag", "--cluster-listen", f"{node.host}:{node.route_port}", "--routes", routes,
                "--store-dir", str(self.root / node.name / "jetstream"),
                "--monitor", f"{node.host}:{node.monitor_port}",
                "--tls-cert", str(self.tls / "server.pem"), "--tls-key", str(self.tls / "server-key.pem"),
                "--tls-ca", str(self.tls / "ca.pem"), "--env-dir", str(self.secrets), "--url", self.urls)
            checked = subprocess.run([NATS_SERVER, "-c", str(self.config(node)), "-t"], capture_output=True,
                                     text=True, timeout=30)
            assert checked.returncode == 0, checked.stderr

    def config(self, node: NatsNode) -> Path:
        return self.root / f"{node.name}.conf"

    def start_node(self, node: NatsNode) -> None:
        process = launch([NATS_SERVER, "-c", str(self.config(node))], self.root / "logs" / f"{node.name}.log")
        self.processes[node.name] = process
        wait_for_port(node.client_port, process, 30, f"nats-server {node.name}", host=node.host)

    def healthy(self, node: NatsNode) -> bool:
        try:
            reply = httpx2.get(f"http://{node.host}:{node.monitor_port}/healthz", timeout=1)
        except httpx2.HTTPError:
            return False
        return reply.status_code == 200 and reply.json().get("status") == "ok"

    def kill(self, name: str) -> None:
        """SIGKILL one process, as a crash would stop it."""
        process = self.processes.pop(name)
        process.kill()
        process.wait()

    def start(self, name: str, command: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        with (self.root / "logs" / f"{name}.log").open("ab") as out:
            process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=self.root)
        self.processes[name] = process
        self.units[name] = (command, env)
        return process

    def restart_exited(self) -> list[str]:
        """systemd's `Restart=always` (RestartSec aside): each service that exited is started again; their names."""
        exited = [name for name in self.units if name in self.processes and self.processes[name].poll() is not None]
        for name in exited:
            self.restarts.append(f"{name} (exit {self.processes[name].returncode})")
            self.start(name, *self.units[name])
        return exited

    def stop(self) -> None:
        # Services first (they finish what they hold), brokers last; a group's processes stop together (eleven
        # shutdowns one after another were most of the teardown).
        for brokers in (False, True):
            group = [self.processes.pop(name) for name in list(self.processes) if name.startswith("nats-") is brokers]
            with ThreadPoolExecutor(max_workers=max(len(group), 1)) as stopping:
                list(stopping.map(lambda process: stop_process(process, within_s=20), group))
        shutil.rmtree(self.root / "executor-host" / "sheshnag", ignore_errors=True)
