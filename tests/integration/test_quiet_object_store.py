"""The embedded object store's log (`logs/s3.log`) stays quiet while idle: nothing in it reads as a fault.

`weed mini`'s maintenance workers find the admin server at its HTTP port + 10000, whatever `-admin.port.grpc` says;
with the admin's gRPC port anywhere else they redialed a closed port every few seconds, each a "connection refused"
warning (most of the log of an idle stack). The filer may find its own gRPC socket not yet open once, as it starts
(an INFO line); nothing may say so again and again."""

import re
import time
from collections import Counter
from pathlib import Path

from infra.embedded import S3Credentials, free_port, start_seaweed, stop_process

IDLE_S = 12.0
"""Long enough for the plugin worker's 5 s redial to come round twice."""
GLOG_FAULT = re.compile(r"^[WEF]\d{4} ")
"""A glog line at WARNING, ERROR or FATAL (`W1205 04:55:12.159819 client.go:247 …`)."""
GLOG_SOURCE = re.compile(r"^[IWEF]\d{4} [\d:.]+ (\S+:\d+) ")
"""The Go source line that logged a glog line: the same one again is a repeat."""


PORT_RACE = "is not available, finding alternative"
"""weed's words when a port chosen for it was taken by another process between the choice and its start (the suite
runs many servers at once): then it listens elsewhere, and the workers' redial is back. Not what is tested here."""


def idle_log(folder: Path) -> list[str]:
    creds = S3Credentials.load_or_create(folder / "s3-credentials.json")
    log_file = folder / "s3.log"
    process = start_seaweed(folder, free_port(), creds, log_file)
    try:
        time.sleep(IDLE_S)
    finally:
        stop_process(process)
    return log_file.read_text(errors="replace").splitlines()


def test_an_idle_object_store_logs_no_warning_and_no_repeated_refused_connection(tmp_path: Path) -> None:
    for attempt in range(3):
        folder = tmp_path / str(attempt)
        folder.mkdir()
        lines = idle_log(folder)
        if not any(PORT_RACE in line for line in lines):
            break
    assert [line for line in lines if GLOG_FAULT.match(line)] == []
    refused = Counter(source.group(1) if (source := GLOG_SOURCE.match(line)) else line
                      for line in lines if "connection refused" in line)
    assert [where for where, times in refused.items() if times > 1] == [], refused
