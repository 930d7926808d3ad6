"""The whole stack as `sheshnag up` runs it: every service its own process, the real model."""

import asyncio
import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest
from openai import OpenAI

from infra.embedded import free_port
from infra.stack_state import STATE_FILE

ADMIN_KEY = "gk-e2e-test-key"


@dataclass
class RunningStack:
    data_dir: Path
    port: int
    process: subprocess.Popen[bytes]
    s3_port: int
    nats_port: int

    @property
    def s3_endpoint(self) -> str:
        return f"127.0.0.1:{self.s3_port}"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def nats_url(self, user: str | None = None, password: str | None = None) -> str:
        """The stack's broker, as a process joining it connects (an executor: its id and worker key)."""
        credentials = f"{user}:{password}@" if user and password else ""
        return f"nats://{credentials}127.0.0.1:{self.nats_port}"

    def client(self, api_key: str = ADMIN_KEY) -> OpenAI:
        return OpenAI(base_url=self.base_url, api_key=api_key, max_retries=0, timeout=60)

    def service_pid(self, name: str) -> int:
        return int((self.data_dir / "logs" / f"{name}.pid").read_text())

    def log(self, name: str) -> str:
        return (self.data_dir / "logs" / f"{name}.log").read_text(errors="replace")


E2E_UPLOAD_LIMIT = 2 * 1024 * 1024
"""Small, so the e2e tests can cross it cheaply."""


PORT_TAKEN = ("address already in use", "Port allocation failed")
"""What a server of the stack logs when a port drawn for it was taken before it bound (by another test worker's
stack, which draws from the same range): that start is abandoned, and the stack started again on new ports."""
STARTS = 3


class PortTaken(Exception):
    pass


def start_stack(data_dir: Path, port: int, extra_env: dict[str, str] | None = None,
                up_args: Sequence[str] = ()) -> RunningStack:
    """`up_args`: more of `sheshnag up`'s options (e.g. `--nats-url` for a broker the test runs itself)."""
    for start in range(STARTS):
        try:
            return _start_stack(data_dir, port if start == 0 else free_port(), extra_env, up_args)
        except PortTaken as taken:
            said = str(taken)
    raise TimeoutError(f"every one of {STARTS} starts found a port taken:\n{said}")


def _start_stack(data_dir: Path, port: int, extra_env: dict[str, str] | None, up_args: Sequence[str]) -> RunningStack:
    env = dict(os.environ, SHESHNAG_ADMIN_KEY=ADMIN_KEY, **(extra_env or {}))
    out = (data_dir.parent / f"up-{port}.out").open("ab")
    s3_port = free_port(frozenset({port}))
    nats_port = free_port(frozenset({port, s3_port}))
    command = [sys.executable, "-m", "infra.cli", "up", "--data-dir", str(data_dir), "--port", str(port),
               "--s3-port", str(s3_port), "--nats-port", str(nats_port), *up_args]
    logged_before = log_sizes(data_dir)
    process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            said = last_lines(out.name)
            if "is in use by another program" in said:  # `up` found a port taken before starting anything
                raise PortTaken(said)
            raise RuntimeError(f"sheshnag up exited with {process.returncode}:\n{said}")
        try:
            # Up once it has announced itself: the gateway answers, and the state file the tools read is written.
            if httpx2.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200 \
                    and (data_dir / STATE_FILE).exists():
                return RunningStack(data_dir, port, process, s3_port, nats_port)
        except httpx2.HTTPError:
            pass
        if port_taken(data_dir, out.name, logged_before):
            stop_stack(RunningStack(data_dir, port, process, s3_port, nats_port))
            raise PortTaken(last_lines(out.name))
        time.sleep(0.3)
    process.kill()
    raise TimeoutError(f"the stack did not come up within 120s:\n{last_lines(out.name)}")


def log_sizes(data_dir: Path) -> dict[Path, int]:
    return {log: log.stat().st_size for log in (data_dir / "logs").glob("*.log")}


def port_taken(data_dir: Path, up_said: str, logged_before: dict[Path, int]) -> bool:
    """Whether a server of the stack crashed, in this start, because its port was taken."""
    if "crashed with exit code" not in Path(up_said).read_text(errors="replace"):
        return False
    for log in (data_dir / "logs").glob("*.log"):
        with log.open("rb") as said:
            said.seek(logged_before.get(log, 0))
            if any(sign in said.read().decode(errors="replace") for sign in PORT_TAKEN):
                return True
    return False


def last_lines(path: str, count: int = 40) -> str:
    """What `up` said last (why it exited, or where it waits)."""
    return "\n".join(Path(path).read_text(errors="replace").splitlines()[-count:])


def assert_replay_equals_live(stack: RunningStack) -> None:
    """`sheshnag ledger replay` against the stack finds no difference. A fact the live ledger folds while the replay
    reads (an executor registering as it comes up) is compared again until the stack is still: a real difference
    stays."""
    from infra.backup import embedded_settings
    from services.ledger import operator

    _, ledger = embedded_settings(stack.data_dir, stack.nats_port, stack.s3_port)
    report = io.StringIO()
    for _ in range(10):
        report = io.StringIO()
        if asyncio.run(operator.replay(ledger, report)) == 0:
            return
        time.sleep(2)
    raise AssertionError(report.getvalue())


def stop_stack(stack: RunningStack) -> None:
    stack.process.send_signal(signal.SIGINT)
    try:
        stack.process.wait(60)
    except subprocess.TimeoutExpired:
        stack.process.kill()
        stack.process.wait()


@pytest.fixture(scope="session")
def stack_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("stack") / "data"


@pytest.fixture(scope="session")
def stack(stack_dir: Path) -> Iterator[RunningStack]:
    # The fuzz test presents hundreds of wrong keys from this one address; the brute-force limit (tested on its own
    # in the unit and integration suites) would then refuse every later test's right key for a minute.
    running = start_stack(stack_dir, free_port(), {"SHESHNAG_GATEWAY_MAX_UPLOAD_BYTES": str(E2E_UPLOAD_LIMIT),
                                                   "SHESHNAG_GATEWAY_MIN_COMPLETION_WINDOW_S": "1",
                                                   "SHESHNAG_GATEWAY_AUTH_FAILURE_LIMIT": "0"},
                           up_args=["--webhooks-to-loopback"])  # test_webhooks' receiver is on this host
    yield running
    stop_stack(running)
