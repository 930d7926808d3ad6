"""Session fixtures that start the real broker and the real S3 server on free loopback ports."""

import asyncio
import faulthandler
import io
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import pytest

from infra.embedded import (
    PORT_RANGE_ENV,
    S3Credentials,
    drawn_ports,
    free_port,
    start_nats,
    start_seaweed,
    stop_process,
)
from services.runtime.nats.bus import EventBus
from services.runtime.process.settings import ConnectionSettings
from services.runtime.storage.objectstore import ObjectStore


def pytest_configure(config: pytest.Config) -> None:
    """Every engine the suite starts computes on one thread: the suite runs on two workers on two cores, each often
    with several executors at once, and llama.cpp's threads waiting on a descheduled sibling made a two-thread
    engine slower than a one-thread one whenever the cores were shared (an operator's setting, unchanged here)."""
    os.environ.setdefault("SHESHNAG_EXECUTOR_N_THREADS", "1")
    own_port_slice()
    config.stash[EXIT_WATCHDOG_FD] = os.dup(sys.__stderr__.fileno() if sys.__stderr__ else 2)
    signal.signal(signal.SIGUSR1, dump_asyncio_tasks(config.stash[EXIT_WATCHDOG_FD]))


def own_port_slice() -> None:
    """Each xdist worker draws its servers' ports from a slice of its own (inherited by every `sheshnag up` it
    starts): a stack's crashed S3 restarting on its port, or a port drawn and not bound yet, was once taken by
    another worker's stack, which then crashed in a loop ("bind: address already in use")."""
    worker, workers = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and worker[2:].isdigit() and workers.isdigit()) or int(workers) < 2:
        return
    low, high = drawn_ports()
    width = (high - low) // int(workers)
    start = low + int(worker[2:]) * width
    os.environ[PORT_RANGE_ENV] = f"{start}-{start + width}"


def dump_asyncio_tasks(fd: int) -> Callable[[int, FrameType | None], None]:
    """`kill -USR1 <pid>` of a test process that seems stuck: every thread's stack, and every task of its running
    event loop with the await it is stopped at, written to the real stderr (pytest captures fd 2 during a test;
    py-spy shows threads, not coroutines)."""

    def dump(signum: int, frame: FrameType | None) -> None:
        faulthandler.dump_traceback(file=fd, all_threads=True)
        try:
            tasks = asyncio.all_tasks(asyncio.get_running_loop())
        except RuntimeError:
            os.write(fd, b"no running event loop\n")
            return
        out = io.StringIO()
        for task in tasks:
            task.print_stack(limit=12, file=out)
        os.write(fd, f"{len(tasks)} asyncio tasks:\n{out.getvalue()}".encode())

    return dump


RERUN_TAIL_LINES = 60
OWN_FRAME = re.compile(r"^(?:tests|services|infra|contracts|bench)/[\w/.]+\.py:\d+: ")
"""A frame's location line in pytest's long report, in this project's code (`tests/e2e/test_x.py:127: in f`)."""
FIRST_TRIES_FAILED: list[str] = []
"""In the process that reports (xdist's controller): why each rerun test failed its first try."""


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """A test that failed and is run once more (`--reruns`): why its first try failed is kept for the summary (the
    plugin's own report names the test only, so a flaky test's cause was lost)."""
    if report.outcome == "rerun" and report.longrepr is not None:
        lines = report.longreprtext.splitlines()
        # The frames of our own code, outermost first: the tail alone is often a library's frame (the SDK's raise).
        ours = [line for line in lines if OWN_FRAME.match(line)]
        tail = "\n".join(lines[-RERUN_TAIL_LINES:])
        where = "".join(f"  at {line}\n" for line in ours)
        FIRST_TRIES_FAILED.append(f"{report.nodeid} ({report.when}):\n{where}{tail}")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    for failure in FIRST_TRIES_FAILED:
        terminalreporter.write_sep("-", "first try failed, then rerun")
        terminalreporter.write_line(failure)



EXIT_WATCHDOG_FD = pytest.StashKey[int]()
EXIT_WITHIN_S = 120.0


def pytest_unconfigure(config: pytest.Config) -> None:
    """A process that has not exited two minutes after its session ended (a thread nobody stopped, a server still
    waited on) prints every thread's stack and exits: the run ends and says why, instead of hanging."""
    if EXIT_WATCHDOG_FD in config.stash:
        faulthandler.dump_traceback_later(EXIT_WITHIN_S, exit=True, file=config.stash[EXIT_WATCHDOG_FD])


LEFT_TASK_ROUNDS, LEFT_TASK_WAIT_S = 5, 5.0


@pytest.fixture(scope="session", autouse=True)
async def no_task_outlives_the_session(pytestconfig: pytest.Config) -> AsyncIterator[None]:
    """At the session's end, the tasks a test left running in the session's event loop are cancelled, again and
    again (a cancelled task whose cleanup awaits a server already stopped is freed by the next cancel), so the loop's
    own teardown, which cancels once and waits for ever, never hangs a worker; any still running are dumped."""
    yield
    current = asyncio.current_task()
    left: list[asyncio.Task[object]] = []
    for _ in range(LEFT_TASK_ROUNDS):
        left = [task for task in asyncio.all_tasks() if task is not current and not task.done()]
        if not left:
            return
        for task in left:
            task.cancel()
        await asyncio.wait(left, timeout=LEFT_TASK_WAIT_S)
    out = io.StringIO()
    for task in left:
        if not task.done():
            task.print_stack(limit=12, file=out)
    os.write(pytestconfig.stash[EXIT_WATCHDOG_FD], f"tasks that would not end:\n{out.getvalue()}".encode())


def pause(pid: int, within_s: float = 10.0) -> None:
    """SIGSTOP `pid`, returning once every thread of it has stopped: on a busy machine a process goes on for a
    moment after the signal (a stalled broker that answers one more request is no stalled broker)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        states = [_thread_state(stat) for stat in Path(f"/proc/{pid}/task").glob("*/stat")]
        if states and all(state in "Tt" for state in states):
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not stop within {within_s}s of SIGSTOP")


def _thread_state(stat: Path) -> str:
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0]  # the field after the command, which may hold spaces
    except (OSError, IndexError):
        return "T"  # a thread that has gone runs no more


@dataclass(frozen=True)
class RunningNats:
    url: str
    process: subprocess.Popen[bytes]


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningNats]:
    data_dir = tmp_path_factory.mktemp("nats")
    port = free_port()
    process = start_nats(data_dir, port, data_dir / "nats.log")
    yield RunningNats(f"nats://127.0.0.1:{port}", process)
    stop_process(process)


@pytest.fixture
def fresh_nats(tmp_path: Path) -> Iterator[RunningNats]:
    """A broker of the test's own, for tests that need an empty event log."""
    port = free_port()
    process = start_nats(tmp_path, port, tmp_path / "nats.log")
    yield RunningNats(f"nats://127.0.0.1:{port}", process)
    stop_process(process)


@dataclass(frozen=True)
class RunningS3:
    endpoint: str
    credentials: S3Credentials


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningS3]:
    data_dir = tmp_path_factory.mktemp("s3")
    creds = S3Credentials.load_or_create(data_dir / "s3-credentials.json")
    port = free_port()
    process = start_seaweed(data_dir, port, creds, data_dir / "weed.log")
    yield RunningS3(f"127.0.0.1:{port}", creds)
    stop_process(process)


@pytest.fixture(scope="session")
def connection(nats_server: RunningNats, s3_server: RunningS3) -> ConnectionSettings:
    return ConnectionSettings(
        nats_url=nats_server.url,
        s3_endpoint=s3_server.endpoint,
        s3_access_key=s3_server.credentials.access_key,
        s3_secret_key=s3_server.credentials.secret_key,
        s3_bucket="sheshnag-tests",
    )


@pytest.fixture
async def bus(connection: ConnectionSettings) -> AsyncIterator[EventBus]:
    bus = await EventBus.connect(connection.nats_url, "tests")
    yield bus
    await bus.close()


@pytest.fixture(scope="session")
async def object_store(connection: ConnectionSettings) -> ObjectStore:
    store = ObjectStore.from_settings(connection)
    await store.ensure_bucket()
    return store
