"""`sheshnag backup`, `restore` and `status` against a deployment whose broker requires TLS, on a host other than this
one (127.0.0.2, as `up --listen` or `nats-config --tls-cert` run it): with the deployment's CA
(`SHESHNAG_NATS_TLS_CA`) they complete, a backup restored onto an empty broker with every message; without it each
exits within moments saying the certificate was not verified, never hanging."""

import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from infra.backup import MANIFEST, Manifest
from infra.embedded import S3Credentials, free_port, start_seaweed, stop_process
from services.runtime.nats.bus import EventBus
from tests.integration.tls_broker import TlsBroker, tls_nats

FACTS = 3
TOOL_TIMEOUT_S = 120
CERTIFICATE_NOT_VERIFIED = "certificate verify failed"


@pytest.fixture(scope="module")
def object_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """An empty S3 server of the module's own (a backup copies every bucket; a restore wants them empty)."""
    data_dir = tmp_path_factory.mktemp("s3")
    credentials = S3Credentials.load_or_create(data_dir / "s3-credentials.json")
    port = free_port()
    process = start_seaweed(data_dir, port, credentials, data_dir / "weed.log")
    yield {"SHESHNAG_S3_ENDPOINT": f"127.0.0.1:{port}", "SHESHNAG_S3_ACCESS_KEY": credentials.access_key,
           "SHESHNAG_S3_SECRET_KEY": credentials.secret_key}
    stop_process(process)


@pytest.fixture
def source(tmp_path: Path) -> Iterator[TlsBroker]:
    with tls_nats(tmp_path / "source") as broker:
        yield broker


@pytest.fixture
def target(tmp_path: Path) -> Iterator[TlsBroker]:
    with tls_nats(tmp_path / "target") as broker:
        yield broker


def sheshnag(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "infra.cli", *args], env=env, capture_output=True, text=True,
                          timeout=TOOL_TIMEOUT_S)


def deployment_env(broker: TlsBroker, object_store: dict[str, str], with_ca: bool = True) -> dict[str, str]:
    """What an operator's shell holds for a deployed stack: its broker (core user), object store and CA."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("SHESHNAG_")}
    env |= {"SHESHNAG_NATS_URL": broker.core_url, **object_store}
    if with_ca:
        env["SHESHNAG_NATS_TLS_CA"] = str(broker.ca)
    return env


async def events(broker: TlsBroker, monkeypatch: pytest.MonkeyPatch, publish: int = 0) -> int:
    """The broker's count of facts, after publishing `publish` more."""
    monkeypatch.setenv("SHESHNAG_NATS_TLS_CA", str(broker.ca))
    bus = await EventBus.connect(broker.core_url, "tests")
    try:
        for index in range(publish):
            await bus.js.publish(f"evt.tests.fact-{index}", b"{}", headers={"Nats-Msg-Id": f"fact-{index}"})
        return (await bus.js.stream_info("EVENTS")).state.messages
    finally:
        await bus.close()


async def test_backup_status_and_restore_complete_against_a_tls_broker_with_its_ca(
        tmp_path: Path, source: TlsBroker, target: TlsBroker, object_store: dict[str, str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert await events(source, monkeypatch, publish=FACTS) == FACTS
    backed_up = sheshnag("backup", str(tmp_path / "backup"), env=deployment_env(source, object_store))
    assert backed_up.returncode == 0, backed_up.stderr
    shown = sheshnag("status", "--json", env=deployment_env(source, object_store))
    assert shown.returncode == 0 and '"stream_last_seq"' in shown.stdout, shown.stderr
    restored = sheshnag("restore", str(tmp_path / "backup"), env=deployment_env(target, object_store))
    assert restored.returncode == 0, restored.stderr
    assert await events(target, monkeypatch) == FACTS


def test_without_the_ca_each_tool_exits_saying_the_certificate_was_not_verified(
        tmp_path: Path, source: TlsBroker, object_store: dict[str, str]) -> None:
    empty = Manifest(taken_at=datetime.now(UTC), streams=[], skipped_streams={}, objects=[], ledger_store=None)
    (tmp_path / "backup").mkdir()
    (tmp_path / "backup" / MANIFEST).write_text(empty.model_dump_json())
    env = deployment_env(source, object_store, with_ca=False)
    for args in (("backup", str(tmp_path / "new-backup")), ("restore", str(tmp_path / "backup")), ("status",)):
        ran = sheshnag(*args, env=env)
        assert ran.returncode != 0 and CERTIFICATE_NOT_VERIFIED in ran.stderr, (args, ran.stderr)
        assert "Traceback" not in ran.stderr, ran.stderr
