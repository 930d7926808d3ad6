"""What a local process sees of a running stack: its processes, the ports they listen on, and raw probes of a
port (a TLS handshake with or without the stack's certificate, a `weed shell` as an attacker would run it)."""

import json
import socket
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psutil

from infra.embedded import venv_binary
from tests.e2e.conftest import ADMIN_KEY, RunningStack

PROCESSES = ("nats", "s3", "ledger", "validator", "scheduler", "executor", "gateway")
"""The supervised processes, by their pid file's name under `<data>/logs/`."""
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
"""A client's HTTP/2 preface and an empty SETTINGS frame: what a gRPC client sends first."""


def stack_pids(stack: RunningStack) -> dict[str, int]:
    pids = {name: int((stack.data_dir / "logs" / f"{name}.pid").read_text()) for name in PROCESSES}
    return {"supervisor": stack.process.pid, **pids}


def listening(pid: int) -> set[tuple[str, int]]:
    """Every TCP (IPv4 and IPv6) address the process listens on."""
    return {(c.laddr.ip, c.laddr.port) for c in psutil.Process(pid).net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN}


def unix_sockets(pid: int) -> set[Path]:
    return {Path(c.laddr) for c in psutil.Process(pid).net_connections(kind="unix") if c.laddr}


def weed_ports(stack: RunningStack) -> dict[str, int]:
    """The inner servers' ports, by flag, from weed's (world-readable) command line."""
    command = psutil.Process(stack_pids(stack)["s3"]).cmdline()
    return {arg[1:].split("=")[0]: int(arg.split("=")[1]) for arg in command
            if arg.startswith("-") and ".port" in arg and "=" in arg}


@dataclass(frozen=True)
class StackSecrets:
    """Every secret of the stack, read from its data dir as only its owner can."""
    s3_secret_key: str
    s3_access_key: str
    core_password: str
    callout_seed: str
    worker_key: str
    admin_key: str = ADMIN_KEY

    @classmethod
    def of(cls, stack: RunningStack) -> "StackSecrets":
        s3 = json.loads((stack.data_dir / "s3-credentials.json").read_text())
        nats = json.loads((stack.data_dir / "nats-auth.json").read_text())
        return cls(s3["secret_key"], s3["access_key"], nats["core_password"], nats["issuer_seed"],
                   (stack.data_dir / "worker-key").read_text().strip())

    def named(self) -> dict[str, str]:
        return {"S3 secret key": self.s3_secret_key, "core NATS password": self.core_password,
                "callout seed": self.callout_seed, "worker key": self.worker_key, "admin key": self.admin_key}


def grpc_over_tls(port: int, cert: tuple[Path, Path] | None) -> bytes:
    """Open TLS to a gRPC server (not checking its certificate, as an attacker would not), presenting `cert`
    if given, send a client's HTTP/2 preface and return what the server answers (b"" when it hangs up)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    if cert is not None:
        context.load_cert_chain(*cert)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        try:
            with context.wrap_socket(raw) as tls:
                tls.sendall(HTTP2_PREFACE)
                return tls.recv(64)
        except (ssl.SSLError, ConnectionError):
            return b""  # TLS 1.3: a missing client certificate is refused by an alert after the handshake


def grpc_in_clear(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        raw.sendall(HTTP2_PREFACE)
        try:
            return raw.recv(64)
        except (TimeoutError, ConnectionError):
            return b""


def is_settings_frame(answer: bytes) -> bool:
    """An HTTP/2 server's first frame is SETTINGS (type 4): the server took us for a client."""
    return len(answer) >= 9 and answer[3] == 0x04


def weed_shell(stack: RunningStack, commands: str, cwd: Path, within_s: float = 12.0) -> str:
    """`weed shell` against the stack's own master and filer, run from `cwd` (SeaweedFS reads `./security.toml`,
    so from a folder without one it is any local user's copy of the binary)."""
    ports = weed_ports(stack)
    master = f"127.0.0.1:{ports['master.port']}.{ports['master.port.grpc']}"
    filer = f"127.0.0.1:{ports['filer.port']}.{ports['filer.port.grpc']}"
    try:
        done = subprocess.run([venv_binary("weed"), "-logtostderr", "shell", f"-master={master}", f"-filer={filer}"],
                              input=commands + "\nexit\n", capture_output=True, text=True, cwd=cwd,
                              timeout=within_s)
    except subprocess.TimeoutExpired as timed_out:
        out = timed_out.stdout or b""
        return out.decode(errors="replace") if isinstance(out, bytes) else out
    return done.stdout + done.stderr
