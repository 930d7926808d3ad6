"""The supervisor of `sheshnag up` never stops for want of disk: a process whose pid file cannot be written runs on
(the file is written once there is room), and a restart that cannot even open its log is tried again after the
usual backoff; a tick that fails for any other reason is logged and the next one runs; SeaweedFS restarted on a
full disk starts with its last start's keys. (Found on a full disk: a service's restart could not write its pid
file, and the supervisor's own crash then stopped the whole stack.)"""

import asyncio
import errno
import sys
import time
from pathlib import Path

import pytest

from infra import embedded
from infra.embedded import S3Credentials, free_port, seaweed_command
from infra.private import write_private_together
from infra.supervised import Supervised
from infra.supervisor import Stack

SLEEPS = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_a_process_whose_pid_file_cannot_be_written_runs_and_the_file_is_written_once_it_can_be(
        tmp_path: Path) -> None:
    child = Supervised("gateway", SLEEPS, None, tmp_path / "gateway.log")
    blocker = tmp_path / "gateway.pid.tmp"
    blocker.mkdir()  # the staging file cannot be written, as on a full disk
    try:
        child.start()
        assert child.process is not None and child.process.poll() is None
        assert not child.pid_file.exists()

        child.check()
        assert not child.pid_file.exists() and child.restarts == 0

        blocker.rmdir()  # room again
        child.check()
        assert child.pid_file.read_text() == str(child.process.pid)
    finally:
        child.stop()


def test_a_restart_that_cannot_open_its_log_is_tried_again_after_a_backoff(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    child = Supervised("executor", SLEEPS, None, logs / "executor.log")
    try:
        child.check()  # no process yet: the start fails (its log's folder is missing), and does not raise
        assert child.process is None and child.next_start_at > time.monotonic()

        logs.mkdir()
        child.check()
        assert child.process is None, "started again before its backoff"

        child.next_start_at = time.monotonic()
        child.check()
        assert child.process is not None and child.process.poll() is None
        assert child.pid_file.read_text() == str(child.process.pid)
    finally:
        child.stop()


async def test_a_supervisor_tick_that_fails_is_logged_and_the_next_one_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    stack = Stack(tmp_path, gateway_port=0, nats_port=0, s3_port=0)
    stop = asyncio.Event()
    ticks: list[int] = []

    async def tick() -> None:
        ticks.append(1)
        if len(ticks) == 1:
            raise ValueError("a bug in one tick")
        stop.set()

    monkeypatch.setattr(stack, "_tick", tick)
    await asyncio.wait_for(stack.supervise(stop), 10)

    assert len(ticks) == 2
    assert "a supervisor tick failed" in caplog.text


def test_files_written_together_are_all_written_or_none_is(tmp_path: Path) -> None:
    kept = tmp_path / "store.key"
    kept.write_bytes(b"the last start's key")
    with pytest.raises(OSError):
        write_private_together({kept: b"a new key", tmp_path / "missing" / "store.crt": b"its certificate"})
    assert kept.read_bytes() == b"the last start's key"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["store.key"], "a staging file was left behind"


def test_seaweedfs_restarted_on_a_full_disk_starts_with_its_last_keys_but_a_first_start_needs_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def disk_full(_: Path) -> Path:
        raise OSError(errno.ENOSPC, "No space left on device")

    credentials = S3Credentials("access", "secret")
    first = tmp_path / "first"
    seaweed_command(first, free_port(), credentials)  # a start with room writes them
    monkeypatch.setattr(embedded, "write_security", disk_full)
    assert "mini" in seaweed_command(first, free_port(), credentials)

    with pytest.raises(OSError):
        seaweed_command(tmp_path / "never-started", free_port(), credentials)
