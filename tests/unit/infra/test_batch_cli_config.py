"""`sheshnag batch` finds its stack as the operator tools do: `--base-url`/`OPENAI_BASE_URL` first, else the running
`sheshnag up` of `--data-dir`, `SHESHNAG_DATA_DIR` or the default data dir, with the key `up` registered."""

import argparse
import os
from pathlib import Path

import pytest

from infra.batch_cli import CliError, config_from
from infra.cli import parse_args
from infra.stack_state import StackState, write_state


def running_stack(data_dir: Path, port: int) -> Path:
    data_dir.mkdir(parents=True)
    write_state(data_dir, StackState(pid=os.getpid(), gateway_url=f"http://127.0.0.1:{port}",
                                     nats_url="nats://127.0.0.1:4", s3_endpoint="127.0.0.1:5", ledger_db_path="x"))
    return data_dir


def args_of(*argv: str) -> argparse.Namespace:
    return parse_args(["batch", *argv])


@pytest.fixture(autouse=True)
def no_openai_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "SHESHNAG_DATA_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SHESHNAG_ADMIN_KEY", "gk-up-admin")


def test_sheshnag_data_dir_names_the_stack_and_its_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHESHNAG_DATA_DIR", str(running_stack(tmp_path / "data", 18001)))
    config = config_from(args_of("list"), tmp_path / "default")
    assert (config.base_url, config.api_key) == ("http://127.0.0.1:18001/v1", "gk-up-admin")


def test_data_dir_option_wins_over_the_openai_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "https://api.example.com/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-elsewhere")
    data_dir = running_stack(tmp_path / "data", 18002)
    for argv in (("--data-dir", str(data_dir), "list"), ("list", "--data-dir", str(data_dir))):
        config = config_from(args_of(*argv), tmp_path / "default")
        assert (config.base_url, config.api_key) == ("http://127.0.0.1:18002/v1", "gk-up-admin"), argv


def test_a_data_dir_without_a_running_stack_says_how_to_start_one(tmp_path: Path) -> None:
    with pytest.raises(CliError, match=r"has no running stack: start one with `sheshnag up --data-dir "):
        config_from(args_of("--data-dir", str(tmp_path / "none"), "list"), tmp_path / "default")


def test_an_explicit_base_url_still_needs_a_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    with pytest.raises(CliError, match="OPENAI_API_KEY"):
        config_from(args_of("list"), tmp_path / "default")


def test_an_openai_key_exported_for_openai_is_never_sent_to_the_local_stack(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHESHNAG_DATA_DIR", str(running_stack(tmp_path / "data", 18003)))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-proj-for-openai")
    assert config_from(args_of("list"), tmp_path / "default").api_key == "gk-up-admin"
    monkeypatch.setenv("OPENAI_API_KEY", "gk-printed-by-up")
    assert config_from(args_of("list"), tmp_path / "default").api_key == "gk-printed-by-up"
