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


def test_an_idle_object_store_logs_no_warning_and_no_repeated_refused_connection(tmp_path: Path) -> None:
    creds = S3Credentials.load_or_create(tmp_path / "s3-credentials.json")
    log_file = tmp_path / "s3.log"
    process = start_seaweed(tmp_path, free_port(), creds, log_file)
    try:
        time.sleep(IDLE_S)
    finally:
        stop_process(process)
    lines = log_file.read_text(errors="replace").splitlines()
    assert [line for line in lines if GLOG_FAULT.match(line)] == []
    refused = Counter(source.group(1) if (source := GLOG_SOURCE.match(line)) else line
                      for line in lines if "connection refused" in line)
    assert [where for where, times in refused.items() if times > 1] == [], refused
