"""The embedded object store leaves nothing behind outside its data dir: its log goes to its own log file (SeaweedFS
writes files into /tmp by default), and the gRPC sockets it always makes in /tmp go when it stops, including one it
named by another port because a process beside it took the chosen one first."""

import os
import tempfile
import time
from pathlib import Path

from infra.embedded import (
    S3Credentials,
    free_port,
    held_seaweed_sockets,
    seaweed_command,
    seaweed_leftovers,
    start_seaweed,
    stop_process,
)

ROLES = ("master", "volume", "filer", "s3", "admin")


def _roles(sockets: list[Path]) -> set[str]:
    return {path.name.split("-")[1] for path in sockets}


def test_a_stopped_object_store_leaves_no_socket_or_log_file_in_tmp(tmp_path: Path) -> None:
    process = start_seaweed(tmp_path, free_port(), S3Credentials("AKLEFTOVERS", "a-secret-of-the-test"),
                            tmp_path / "weed.log")
    command = [str(arg) for arg in process.args]  # type: ignore[union-attr]
    try:
        deadline = time.monotonic() + 60  # the inner servers come up one after another after S3 listens
        while _roles(held_seaweed_sockets(process.pid)) != set(ROLES) and time.monotonic() < deadline:
            time.sleep(0.2)
        held = held_seaweed_sockets(process.pid)
        said = (tmp_path / "weed.log").read_text(errors="replace").splitlines()[-30:]
        assert _roles(held) == set(ROLES), f"sockets held: {held}; its log ends:\n" + "\n".join(said)
        assert all(path.exists() for path in held)
    finally:
        stop_process(process)

    assert [path for path in [*held, *seaweed_leftovers(command)] if path.exists()] == []
    assert [name for name in os.listdir(tempfile.gettempdir())
            if name.startswith("weed.") and name.endswith(f".{process.pid}")] == []
    assert (tmp_path / "weed.log").stat().st_size > 0


def test_a_store_too_deep_for_local_sockets_has_them_in_tmp_named_among_its_leftovers(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 100)
    command = seaweed_command(deep, free_port(), S3Credentials("AKLEFTOVERS", "a-secret-of-the-test"))
    flags = dict(arg[1:].split("=", 1) for arg in command if arg.startswith("-") and "=" in arg)

    assert "s3.localSocket" not in flags
    assert {Path(f"/tmp/seaweedfs-s3-{flags['s3.port']}.sock"),
            Path(f"/tmp/seaweedfs-filer-{flags['filer.port']}.sock")} <= set(seaweed_leftovers(command))
