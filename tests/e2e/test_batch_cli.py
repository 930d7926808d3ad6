"""`sheshnag batch`, configured the OpenAI SDK's way, against a real stack: a 5-line file in, 5 output lines out and
exit 0; refused lines make exit 1 and land in the error file; a failed validation shows its errors grouped with line
numbers and fixes; the steps one at a time; a wait resumed by id; the stack and a key found from its data dir alone;
a reader that goes away ends the command quietly."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import ADMIN_KEY, RunningStack
from tests.factories import chat_line

pytestmark = pytest.mark.e2e


def batch(stack: RunningStack, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OPENAI_BASE_URL": stack.base_url, "OPENAI_API_KEY": ADMIN_KEY}
    return subprocess.run([sys.executable, "-m", "infra.cli", "batch", *args], capture_output=True, text=True,
                          timeout=300, env=env, cwd=cwd)


def write_lines(path: Path, rows: list[object]) -> Path:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def test_run_turns_a_five_line_file_into_five_output_lines_and_exit_0(stack: RunningStack, tmp_path: Path) -> None:
    source = write_lines(tmp_path / "in.jsonl", [chat_line(f"cli-{n}", f"Say {n}.", max_tokens=4) for n in range(5)])
    ran = batch(stack, "run", str(source), "-o", str(tmp_path / "out.jsonl"), cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    output = [json.loads(row) for row in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert sorted(row["custom_id"] for row in output) == [f"cli-{n}" for n in range(5)]
    assert all(row["response"]["status_code"] == 200 for row in output)
    assert not (tmp_path / "out.errors.jsonl").exists()
    assert "uploading in.jsonl: 100 %" in ran.stderr and "5/5 lines (0 failed) completed" in ran.stderr


def test_refused_lines_go_to_the_error_file_and_exit_1(stack: RunningStack, tmp_path: Path) -> None:
    source = write_lines(tmp_path / "in.jsonl", [chat_line("ok-1", "Hi.", max_tokens=2), '{"custom_id": "broken"',
                                                 chat_line("ok-2", "Hello.", max_tokens=2)])
    ran = batch(stack, "run", str(source), "-o", str(tmp_path / "out.jsonl"), "--errors", str(tmp_path / "err.jsonl"),
                "--allow-partial", cwd=tmp_path)
    assert ran.returncode == 1, ran.stderr
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 2
    errors = [json.loads(row) for row in (tmp_path / "err.jsonl").read_text().splitlines()]
    assert [row["error"]["code"] for row in errors] == ["invalid_json"] and errors[0]["line"] == 2


def test_the_steps_one_at_a_time_and_a_wait_resumed_by_id(stack: RunningStack, tmp_path: Path) -> None:
    source = write_lines(tmp_path / "in.jsonl", [chat_line(f"step-{n}", f"Name {n}.", max_tokens=3)
                                                 for n in range(3)])
    submitted = batch(stack, "submit", str(source), "--metadata", "team=cli", cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    batch_id = submitted.stdout.strip()
    assert batch_id.startswith("batch_")
    waited = batch(stack, "wait", batch_id, cwd=tmp_path)
    assert waited.returncode == 0, waited.stderr
    status = json.loads(batch(stack, "status", batch_id, cwd=tmp_path).stdout)
    assert status["status"] == "completed" and status["metadata"] == {"team": "cli"}
    resumed = batch(stack, "run", batch_id, "-o", str(tmp_path / "again.jsonl"), cwd=tmp_path)
    assert resumed.returncode == 0 and len((tmp_path / "again.jsonl").read_text().splitlines()) == 3, resumed.stderr
    downloaded = batch(stack, "download", batch_id, "-o", str(tmp_path / "dl.jsonl"), cwd=tmp_path)
    assert downloaded.returncode == 0 and (tmp_path / "dl.jsonl").read_text() == (tmp_path / "again.jsonl").read_text()
    listed = batch(stack, "list", cwd=tmp_path)
    assert listed.returncode == 0 and any(row.startswith(f"{batch_id}\tcompleted\t3/3")
                                          for row in listed.stdout.splitlines()), listed.stdout


def test_without_a_key_it_says_how_to_give_one(stack: RunningStack, tmp_path: Path) -> None:
    env = {name: value for name, value in os.environ.items() if name != "OPENAI_API_KEY"}
    refused = subprocess.run([sys.executable, "-m", "infra.cli", "batch", "--base-url", stack.base_url, "list"],
                             capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert refused.returncode == 2 and "OPENAI_API_KEY" in refused.stderr
    wrong = subprocess.run([sys.executable, "-m", "infra.cli", "batch", "--base-url", stack.base_url, "--api-key",
                            "gk-wrong", "list"], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert wrong.returncode == 2 and "401" in wrong.stderr and "invalid_api_key" in wrong.stderr


def test_a_failed_validation_prints_its_errors_grouped_with_line_numbers_and_fixes(stack: RunningStack,
                                                                                    tmp_path: Path) -> None:
    source = write_lines(tmp_path / "in.jsonl", [chat_line("v-1", "Hi.", max_tokens=2), '{"custom_id": "broken"',
                                                 chat_line("v-3", "Hello.", max_tokens=2),
                                                 chat_line("v-3", "Again.", max_tokens=2)])
    ran = batch(stack, "run", str(source), "-o", str(tmp_path / "out.jsonl"), cwd=tmp_path)
    assert ran.returncode == 2, ran.stderr
    shown = ran.stderr.splitlines()
    assert "[##############################] 4/4 lines (4 failed) failed" in shown, ran.stderr
    assert "2 problems found, of 2 kinds:" in shown, ran.stderr
    assert "  Line is not valid JSON (invalid_json) x 1: line 2" in shown, ran.stderr
    assert "  custom_id used twice (duplicate_custom_id) x 1: line 4, field custom_id" in shown, ran.stderr
    assert any(row.startswith("    Fix: Make every custom_id unique") for row in shown), ran.stderr
    assert any(row.startswith("4 failed lines in the error file: ") for row in shown), ran.stderr


def test_the_data_dir_alone_gives_the_stack_and_a_key(stack: RunningStack, tmp_path: Path) -> None:
    env = {name: value for name, value in os.environ.items() if not name.startswith(("OPENAI_", "SHESHNAG_"))}
    for how, extra in ((["--data-dir", str(stack.data_dir)], {}), ([], {"SHESHNAG_DATA_DIR": str(stack.data_dir)})):
        listed = subprocess.run([sys.executable, "-m", "infra.cli", "batch", *how, "list"], capture_output=True,
                                text=True, timeout=120, env={**env, **extra}, cwd=tmp_path)
        assert listed.returncode == 0, (how, listed.stderr)
    assert (stack.data_dir / "cli-api-key").stat().st_mode & 0o077 == 0


def test_a_reader_that_goes_away_ends_the_listing_quietly(stack: RunningStack, tmp_path: Path) -> None:
    env = {**os.environ, "OPENAI_BASE_URL": stack.base_url, "OPENAI_API_KEY": ADMIN_KEY}
    errors = tmp_path / "stderr"
    with errors.open("w") as sink:
        listing = subprocess.Popen([sys.executable, "-m", "infra.cli", "batch", "list"], stdout=subprocess.PIPE,
                                   stderr=sink, env=env, cwd=tmp_path)
        assert listing.stdout is not None
        listing.stdout.close()  # `| head` that has read enough, before a line was written
        assert listing.wait(120) == 141
    assert errors.read_text() == ""
