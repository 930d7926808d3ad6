"""The project as a user gets it: `pip install` of the checkout into a new virtual environment (no `run.sh`, no
model wheel, no test toolchain), then `sheshnag up` from outside the checkout installs the model it serves, comes
up, and `sheshnag batch run` turns a 5-line file into 5 output lines with exit 0."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx2
import pytest

from infra.embedded import free_port
from tests.e2e.conftest import ADMIN_KEY, RunningStack, stop_stack
from tests.factories import chat_line

pytestmark = pytest.mark.e2e
CHECKOUT = Path(__file__).parents[2]


def test_a_fresh_pip_install_runs_a_batch_with_sheshnag_up(tmp_path_factory: pytest.TempPathFactory) -> None:
    home = tmp_path_factory.mktemp("fresh")
    venv = home / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    installed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-compile",
                                "--disable-pip-version-check", str(CHECKOUT)],
                               capture_output=True, text=True, timeout=600, cwd=home)
    assert installed.returncode == 0, installed.stderr[-3000:]
    # Nothing of the checkout is importable from here: what runs is what pip installed.
    env = {name: value for name, value in os.environ.items() if not name.startswith(("SHESHNAG_", "PYTHON"))}
    env["SHESHNAG_ADMIN_KEY"] = ADMIN_KEY
    port = free_port()
    data_dir = home / "data"
    log = (home / "up.out").open("ab")
    process = subprocess.Popen([str(venv / "bin" / "sheshnag"), "up", "--data-dir", str(data_dir), "--port", str(port)],
                               env=env, stdout=log, stderr=subprocess.STDOUT, cwd=home)
    stack = RunningStack(data_dir, port, process, 0, 0)
    try:
        deadline = time.monotonic() + 240
        while True:
            assert process.poll() is None, (home / "up.out").read_text()[-3000:]
            assert time.monotonic() < deadline, (home / "up.out").read_text()[-3000:]
            try:
                if httpx2.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx2.HTTPError:
                pass
            time.sleep(0.5)
        source = home / "in.jsonl"
        source.write_text("".join(json.dumps(chat_line(f"fresh-{n}", f"Say {n}.", max_tokens=4)) + "\n"
                                  for n in range(5)))
        sdk = {"OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1", "OPENAI_API_KEY": ADMIN_KEY}
        command = [str(venv / "bin" / "sheshnag"), "batch", "run", str(source), "-o", str(home / "out.jsonl")]
        ran = subprocess.run(command, env={**env, **sdk}, capture_output=True, text=True, timeout=300, cwd=home)
        assert ran.returncode == 0, ran.stderr[-3000:] + (data_dir / "logs" / "executor.log").read_text()[-3000:]
        output = [json.loads(row) for row in (home / "out.jsonl").read_text().splitlines()]
        assert sorted(row["custom_id"] for row in output) == [f"fresh-{n}" for n in range(5)]
        assert "installing the weights of" in (home / "up.out").read_text()
    finally:
        stop_stack(stack)
