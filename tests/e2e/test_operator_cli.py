"""The operator CLI finds its stack: `sheshnag up` leaves a state file in its data dir, and `status`, `keys`, `users`
and `ledger …` act on the stack it names (`--data-dir`), or say plainly that none runs there — never a guess at
the machine's own broker; `backup` finds it from its data dir alone; `credits show` shows a balance; a reader that goes
away ends a command quietly."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.stack_state import read_state
from tests.e2e.conftest import RunningStack

pytestmark = pytest.mark.e2e
EXECUTOR_UP_WITHIN_S = 120.0


def sheshnag(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {name: value for name, value in os.environ.items() if name != "SHESHNAG_NATS_URL"}
    return subprocess.run([sys.executable, "-m", "infra.cli", *args], capture_output=True, text=True, timeout=120,
                          env={**environ, **(env or {})})


def test_the_tools_act_on_the_stack_their_data_dir_names(stack: RunningStack) -> None:
    state = read_state(stack.data_dir)
    assert state is not None and state.alive() and state.gateway_url.endswith(f":{stack.port}")
    data_dir = str(stack.data_dir)

    deadline = time.monotonic() + EXECUTOR_UP_WITHIN_S
    while True:  # the stack is up once its gateway is; its executor's first heartbeat follows its model's load
        shown = sheshnag("status", "--data-dir", data_dir)
        assert shown.returncode == 0, shown.stderr
        if "local-0" in shown.stdout or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert "local-0" in shown.stdout, shown.stdout  # the stack's own executor, from its heartbeat

    made = sheshnag("users", "create", "cli-operator", "--name", "Cli Operator", "--data-dir", data_dir)
    assert made.returncode == 0 and made.stdout.strip() == "cli-operator", made.stderr
    users = sheshnag("users", "list", "--data-dir", data_dir)
    assert users.returncode == 0 and any(line.startswith("cli-operator\tdefault\tmember")
                                         for line in users.stdout.splitlines()), users.stdout
    keys = sheshnag("keys", "list", "--data-dir", data_dir)
    assert keys.returncode == 0 and "\tadmin\tactive\t" in keys.stdout and "gk-" not in keys.stdout, keys.stdout

    verified = sheshnag("ledger", "verify", "--data-dir", data_dir)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_backup_needs_only_the_data_dir_and_credits_show_prints_the_balance(stack: RunningStack,
                                                                           tmp_path: Path) -> None:
    backed_up = sheshnag("backup", str(tmp_path / "backup"), "--data-dir", str(stack.data_dir))
    assert backed_up.returncode == 0, backed_up.stderr
    assert (tmp_path / "backup" / "manifest.json").exists() and backed_up.stdout.startswith("backed up ")
    shown = sheshnag("credits", "show", "--data-dir", str(stack.data_dir))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("default: balance ") and " USD, reserved " in shown.stdout, shown.stdout


def test_status_json_into_a_closed_pipe_ends_quietly(stack: RunningStack, tmp_path: Path) -> None:
    environ = {name: value for name, value in os.environ.items() if name != "SHESHNAG_NATS_URL"}
    errors = tmp_path / "stderr"
    with errors.open("w") as sink:
        shown = subprocess.Popen([sys.executable, "-m", "infra.cli", "status", "--json", "--data-dir",
                                  str(stack.data_dir)], stdout=subprocess.PIPE, stderr=sink, env=environ)
        assert shown.stdout is not None
        shown.stdout.close()  # `| head` that has read enough
        assert shown.wait(120) == 141
    assert errors.read_text() == ""


def test_without_a_running_stack_the_tools_say_so_and_touch_no_broker(tmp_path: Path) -> None:
    for args in (["status"], ["keys", "list"], ["ledger", "verify"]):
        refused = sheshnag(*args, env={"XDG_DATA_HOME": str(tmp_path)})
        assert refused.returncode == 1, refused.stdout
        assert f"{tmp_path / 'sheshnag'} has no running stack" in refused.stderr
        assert "sheshnag up --data-dir" in refused.stderr and "4222" not in refused.stderr + refused.stdout


def test_the_version_is_the_installed_package_s() -> None:
    shown = sheshnag("--version")
    assert shown.returncode == 0 and shown.stdout.startswith("sheshnag ")
