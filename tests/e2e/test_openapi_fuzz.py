"""Schemathesis drives every route in `/openapi.json` of the running stack: no input may produce a 5xx."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import ADMIN_KEY, RunningStack

pytestmark = pytest.mark.e2e

EXAMPLES_PER_OPERATION = 10
"""Small enough for CI (about half a minute for every route), large enough to hit each validator; the raw-bytes
attack test (tests/security/test_raw_bytes.py) sends every declared parameter and header hostile bytes besides."""


def test_no_generated_request_gets_a_server_error(stack: RunningStack, tmp_path: Path) -> None:
    schema = stack.base_url.removesuffix("/v1") + "/openapi.json"
    run = subprocess.run(
        [str(Path(sys.executable).with_name("schemathesis")), "run", schema, "--checks", "not_a_server_error",
         "--header", f"Authorization: Bearer {ADMIN_KEY}", "--max-examples", str(EXAMPLES_PER_OPERATION),
         "--exclude-path", "/v1/batches/{batch_id}/events", "--request-timeout", "20",
         # Revoking keys with ids from listed responses revokes the session's admin key (every later test of the
         # session's stack refused) or its executor's worker key (no executor: every later batch waits for good).
         "--exclude-operation-id", "revokeKey", "--exclude-operation-id", "revokeWorkerKey"],
        capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
