"""A server whose command is built afresh for each start (SeaweedFS, whose inner ports another process may take
between their pick and its bind) is started again when it exits during start-up; any other server's exit is final."""

import sys
from pathlib import Path

import pytest

from infra.embedded import free_port
from infra.supervised import START_TRIES, Supervised, start_until_listening

EXITS_AT_ONCE = [sys.executable, "-c", "raise SystemExit(3)"]


def listens_on(port: int) -> list[str]:
    return [sys.executable, "-c", "import socket, time\n"
            f"s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); time.sleep(60)"]


def test_a_server_built_afresh_is_started_again_after_exiting_during_start_up(tmp_path: Path) -> None:
    port = free_port()
    built: list[int] = []

    def command() -> list[str]:
        built.append(1)
        return EXITS_AT_ONCE if len(built) == 1 else listens_on(port)  # its first pick was taken meanwhile

    child = Supervised("s3", [], None, tmp_path / "s3.log", make_command=command)
    try:
        start_until_listening(child, port, 30, "127.0.0.1")
        assert len(built) == 2 and child.process is not None and child.process.poll() is None
    finally:
        child.stop()


def test_a_server_that_keeps_exiting_fails_after_its_tries_and_one_with_a_fixed_command_at_once(
        tmp_path: Path) -> None:
    built: list[int] = []

    def command() -> list[str]:
        built.append(1)
        return EXITS_AT_ONCE

    with pytest.raises(RuntimeError, match="during start-up"):
        start_until_listening(Supervised("s3", [], None, tmp_path / "s3.log", make_command=command), free_port(), 30,
                              "127.0.0.1")
    assert len(built) == START_TRIES
    with pytest.raises(RuntimeError, match="during start-up"):
        start_until_listening(Supervised("nats-server", EXITS_AT_ONCE, None, tmp_path / "nats.log"), free_port(), 30,
                              "127.0.0.1")


def test_a_server_that_would_not_start_is_reported_with_the_end_of_its_log(tmp_path: Path) -> None:
    says_why = [sys.executable, "-c", "import sys; print('early line');"
                " print('Port allocation failed', file=sys.stderr); raise SystemExit(255)"]
    with pytest.raises(RuntimeError, match=r"(?s)exited with code 255.*Port allocation failed"):
        start_until_listening(Supervised("s3", [], None, tmp_path / "s3.log", make_command=lambda: says_why),
                              free_port(), 30, "127.0.0.1")
