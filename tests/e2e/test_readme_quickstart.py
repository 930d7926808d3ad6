"""The README's quickstart works as written: its bash blocks between the `quickstart` markers run, in one shell from a
clone's root, against a running stack (its port for 8080, its data dir for the default one), and the Python block
shown is the example file they run. A README that drifts from what works fails here."""

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import RunningStack

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"


def quickstart() -> str:
    text = README.read_text()
    start, end = text.index("<!-- quickstart"), text.index("<!-- /quickstart -->")
    return text[start:end]


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL)


def test_the_readme_starts_with_its_two_commands() -> None:
    first = blocks(README.read_text(), "bash")[0].splitlines()
    assert [line.split("#")[0].strip() for line in first] == ["./run.sh up", "./run.sh test"]


def test_the_python_block_is_the_example_file_the_quickstart_runs() -> None:
    assert blocks(quickstart(), "python") == [(REPO / "examples" / "sdk_loop.py").read_text()]


def test_the_quickstart_commands_run_as_written(stack: RunningStack, tmp_path: Path) -> None:
    script = "\n".join(blocks(quickstart(), "bash")).replace("127.0.0.1:8080", f"127.0.0.1:{stack.port}")
    assert ".venv/bin/sheshnag batch run examples/requests.jsonl" in script
    for name in (".venv", "examples"):  # a clone's root, with what `./run.sh up` installed
        (tmp_path / name).symlink_to(REPO / name)
    env = {name: value for name, value in os.environ.items() if not name.startswith(("OPENAI_", "SHESHNAG_"))}
    env["SHESHNAG_DATA_DIR"] = str(stack.data_dir)  # the stack stands in for the default data dir's
    ran = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    results = [json.loads(row) for row in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert sorted(row["custom_id"] for row in results) == ["q-0", "q-1", "q-2"]
    assert all(row["response"]["status_code"] == 200 for row in results)
    assert "3/3 lines (0 failed) completed" in ran.stderr
    assert "completed BatchRequestCounts(completed=3, failed=0, total=3)" in ran.stdout, ran.stdout
