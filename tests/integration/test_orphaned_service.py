"""A service started by `sheshnag up` stops cleanly once its supervisor is gone (killed outright, it never stopped
its children), instead of running on unsupervised; one started by anything else ignores its parent, also with the
supervisor's variable copied from another service's environment."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SERVICE = """
import asyncio, sys
from pathlib import Path
from services.runtime.process.runner import run_until_signalled

async def main(stop: asyncio.Event) -> None:
    Path(sys.argv[1]).write_text("running")
    await stop.wait()
    Path(sys.argv[1]).write_text("stopped cleanly")

run_until_signalled(main)
"""
SUPERVISOR = """
import os, subprocess, sys, time
env = dict(os.environ)
if sys.argv[2] == "supervised":
    env["SHESHNAG_SUPERVISOR_PID"] = str(os.getpid())
elif sys.argv[2] == "inherited":  # the variable copied from another service's environment: not its parent
    env["SHESHNAG_SUPERVISOR_PID"] = "1"
child = subprocess.Popen([sys.executable, "-c", sys.argv[3], sys.argv[1]], env=env, start_new_session=True)
print(child.pid, flush=True)
time.sleep(600)
"""


def start(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[str], int, Path]:
    state = tmp_path / f"{mode}.state"
    supervisor = subprocess.Popen([sys.executable, "-c", SUPERVISOR, str(state), mode, SERVICE],
                                  stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])
    assert supervisor.stdout is not None
    child = int(supervisor.stdout.readline())
    deadline = time.monotonic() + 60
    while not state.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert state.read_text() == "running"
    return supervisor, child, state


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


def test_a_supervised_service_stops_cleanly_once_its_supervisor_is_killed(tmp_path: Path) -> None:
    supervisor, child, state = start(tmp_path, "supervised")
    supervisor.send_signal(signal.SIGKILL)
    supervisor.wait()
    deadline = time.monotonic() + 30
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(child) and state.read_text() == "stopped cleanly"


@pytest.mark.parametrize("mode", ["unsupervised", "inherited"])
def test_a_service_started_otherwise_runs_on_when_its_parent_goes(tmp_path: Path, mode: str) -> None:
    supervisor, child, state = start(tmp_path, mode)
    try:
        supervisor.send_signal(signal.SIGKILL)
        supervisor.wait()
        time.sleep(3)  # three times the check's interval: a supervised one would have stopped by now
        assert alive(child) and state.read_text() == "running"
    finally:
        os.kill(child, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
