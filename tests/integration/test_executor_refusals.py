"""An executor that cannot join says why, once per try, and backs off: against a real nats-server with the auth
callout (a refused worker key) or with a certificate from a CA it does not trust; it gives up after
`SHESHNAG_EXECUTOR_MAX_REFUSALS` with exit status 78, and stops within moments of SIGTERM while it waits."""

import asyncio
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from contracts.ids import hash_api_key
from contracts.readmodel import ApiKeyRecord
from infra.embedded import free_port, start_nats, stop_process
from services.executor.adapters.broker import join
from services.executor.adapters.refusals import EXIT_REFUSED, JoinRefused
from services.executor.settings import ExecutorSettings
from services.runtime.process.settings import ConnectionSettings
from tests.certificates import write_tls_files
from tests.integration.authorized_broker import REVOKED_KEY, USER_KEY, AuthorizedBroker, admitting_broker
from tests.support import put_api_key

ADMIN_KEY = "gk-admin"
WAIT = re.compile(r"trying again in ([\d.]+)s")


def executor_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("services.executor")]


def backing_off(running: AuthorizedBroker, key: str, **settings: object) -> ExecutorSettings:
    return running.executor_settings("alpha", key).model_copy(update={"join_retry_s": 0.25, **settings})


async def test_a_refused_key_is_said_once_per_try_with_waits_that_double_up_to_the_cap_and_a_stop_ends_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    async with admitting_broker(tmp_path) as running:
        settings = backing_off(running, REVOKED_KEY, join_retry_max_s=0.5)
        stop = asyncio.Event()
        joining = asyncio.create_task(join(settings, stop))
        await asyncio.sleep(3.0)
        tried = len([line for line in executor_lines(caplog) if "cannot join" in line])
        stop.set()
        assert await asyncio.wait_for(joining, 30) is None
        assert len([line for line in executor_lines(caplog) if "cannot join" in line]) == tried, \
            "a stop ends the wait: no try after it"
    said = executor_lines(caplog)
    refusals = [line for line in said if "cannot join" in line]
    assert 4 <= len(refusals) <= 8, said  # a handful in 3 s, not hundreds
    assert all("Authorization Violation" in line and "revoked" in line for line in refusals)
    waits = [float(WAIT.search(line)[1]) for line in refusals]  # type: ignore[index]
    assert waits[:4] == [0.25, 0.5, 0.5, 0.5], "doubled each time, capped"
    assert len(said) <= len(refusals) + 2, said
    assert not [r for r in caplog.records if r.exc_info], "no tracebacks"


@pytest.mark.parametrize("key", ["wk-never-created", USER_KEY, ADMIN_KEY], ids=["unknown", "user", "admin"])
async def test_an_executor_gives_up_after_max_refusals_of_a_key_that_is_not_a_live_worker_key(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, key: str) -> None:
    async with admitting_broker(tmp_path) as running:
        await put_api_key(running.read_model, hash_api_key(ADMIN_KEY), ApiKeyRecord(
            key_id="key_admin", role="admin", label="admin"))
        settings = backing_off(running, key, join_retry_s=0.1, max_refusals=3)
        stop = asyncio.Event()
        with pytest.raises(JoinRefused, match="refused 3 times"):
            await asyncio.wait_for(join(settings, stop), 10)
    assert len([line for line in executor_lines(caplog) if "cannot join" in line]) == 3


async def test_a_broker_certificate_from_another_ca_is_said_once_per_try_as_a_tls_failure(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("served", "trusted"):
        (tmp_path / name).mkdir()
    served, trusted = write_tls_files(tmp_path / "served"), write_tls_files(tmp_path / "trusted")
    config = tmp_path / "nats.conf"
    config.write_text(f'tls {{ cert_file: "{served.cert}", key_file: "{served.key}" }}\n')
    monkeypatch.setenv("SHESHNAG_NATS_TLS_CA", str(trusted.ca))
    port = free_port()
    process = start_nats(tmp_path, port, tmp_path / "nats.log", config)
    try:
        settings = ExecutorSettings(connection=ConnectionSettings(nats_url=f"nats://127.0.0.1:{port}"),
                                    executor_id="alpha", worker_key="wk-alpha", join_retry_s=1.0, max_refusals=2)
        stop = asyncio.Event()
        with pytest.raises(JoinRefused):
            await asyncio.wait_for(join(settings, stop), 10)
    finally:
        stop_process(process)
    said = executor_lines(caplog)
    assert len(said) == 2, said
    assert all("TLS handshake with NATS failed" in line and "SHESHNAG_NATS_TLS_CA" in line
               and "certificate verify failed" in line for line in said)


def nats_dir(tmp_path: Path) -> Path:
    (tmp_path / "nats").mkdir()
    return tmp_path / "nats"


def executor_process(running: AuthorizedBroker, tmp_path: Path, **env: str) -> subprocess.Popen[str]:
    """`python -m services.executor` with a revoked key, loading no model (it never gets to use one)."""
    return subprocess.Popen(
        [sys.executable, "-m", "services.executor"], stderr=subprocess.PIPE, text=True, cwd=os.getcwd(),
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "SHESHNAG_NATS_URL": running.url,
             "SHESHNAG_METRICS_PORT": "0", "SHESHNAG_EXECUTOR_EXECUTOR_ID": "alpha",
             "SHESHNAG_EXECUTOR_WORKER_KEY": REVOKED_KEY, "SHESHNAG_EXECUTOR_PRELOAD_MODELS": "[]",
             "SHESHNAG_EXECUTOR_JOIN_RETRY_S": "0.2", **env})


async def test_the_executor_process_exits_78_after_max_refusals(tmp_path: Path) -> None:
    async with admitting_broker(nats_dir(tmp_path)) as running:
        process = executor_process(running, tmp_path, SHESHNAG_EXECUTOR_MAX_REFUSALS="2")
        code = await asyncio.to_thread(process.wait, 30)
        assert process.stderr is not None
        log = process.stderr.read()
    assert code == EXIT_REFUSED, log
    assert log.count("cannot join") == 2 and "Traceback" not in log, log


async def test_the_executor_process_stops_within_moments_of_sigterm_while_it_backs_off(tmp_path: Path) -> None:
    async with admitting_broker(nats_dir(tmp_path)) as running:
        # Its first wait is two minutes: a stop that waited it out would take that long.
        process = executor_process(running, tmp_path, SHESHNAG_EXECUTOR_JOIN_RETRY_S="120",
                                   SHESHNAG_EXECUTOR_JOIN_RETRY_MAX_S="120")
        assert process.stderr is not None
        line = ""
        while "cannot join" not in line:
            line = await asyncio.to_thread(process.stderr.readline)
            assert line, "it exited before it was refused"
        await asyncio.sleep(0.5)  # into its wait
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(process.wait, 90)
    assert code == 0 and time.monotonic() - signalled < 60, "it stopped without waiting out its backoff"
