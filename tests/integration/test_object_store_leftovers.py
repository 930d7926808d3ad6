"""The embedded object store leaves nothing behind outside its data dir: its log goes to its own log file (SeaweedFS
writes files into /tmp by default), and the gRPC sockets it always makes in /tmp go when it stops."""

import os
import tempfile
import time
from pathlib import Path

from infra.embedded import S3Credentials, free_port, seaweed_leftovers, start_seaweed, stop_process


def test_a_stopped_object_store_leaves_no_socket_or_log_file_in_tmp(tmp_path: Path) -> None:
    process = start_seaweed(tmp_path, free_port(), S3Credentials("AKLEFTOVERS", "a-secret-of-the-test"),
                            tmp_path / "weed.log")
    command = [str(arg) for arg in process.args]  # type: ignore[union-attr]
    try:
        deadline = time.monotonic() + 60  # the inner servers come up one after another after S3 listens
        while not all(path.exists() for path in seaweed_leftovers(command)) and time.monotonic() < deadline:
            time.sleep(0.2)
        missing = [path for path in seaweed_leftovers(command) if not path.exists()]
        said = (tmp_path / "weed.log").read_text(errors="replace").splitlines()[-30:]
        assert seaweed_leftovers(command) and not missing, f"never made: {missing}; its log ends:\n" + "\n".join(said)
    finally:
        stop_process(process)

    assert [path for path in seaweed_leftovers(command) if path.exists()] == []
    assert [name for name in os.listdir(tempfile.gettempdir())
            if name.startswith("weed.") and name.endswith(f".{process.pid}")] == []
    assert (tmp_path / "weed.log").stat().st_size > 0
