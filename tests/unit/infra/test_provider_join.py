"""`sheshnag executor --deployment URL --worker-key wk-…` (infra/provider_join.py): the executor's environment is
made from the gateway's answer alone: its broker, the CA kept in its own data dir, its worker key and id."""

import argparse
from pathlib import Path

import pytest

import infra.provider_join as join
from infra.tls import ensure_server_tls, fingerprint


def args(data_dir: Path, **more: object) -> argparse.Namespace:
    return argparse.Namespace(**{"deployment": "https://10.1.2.3:8080", "worker_key": "wk-abc", "data_dir": data_dir,
                                 "executor_id": None, "ca_sha256": None, **more})


@pytest.fixture
def ca_pem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    pem = ensure_server_tls(tmp_path / "control", ["10.1.2.3"]).ca_pem()
    answer = {"nats_urls": ["tls://10.1.2.3:4222"], "tls_ca_pem": pem, "tls_ca_sha256": fingerprint(pem)}
    monkeypatch.setattr(join, "fetch_connection", lambda deployment, pin: answer)
    return pem


def test_the_executor_gets_the_broker_the_ca_and_its_key_and_no_other_credentials(
        tmp_path: Path, ca_pem: str) -> None:
    env, data_dir, digest = join.executor_env(args(tmp_path / "host"), {"PATH": "/bin"})
    assert env["SHESHNAG_NATS_URL"] == "tls://10.1.2.3:4222"
    assert Path(env["SHESHNAG_NATS_TLS_CA"]).read_text() == ca_pem
    assert Path(env["SHESHNAG_NATS_TLS_CA"]).parent == data_dir == (tmp_path / "host").resolve()
    assert env["SHESHNAG_EXECUTOR_WORKER_KEY"] == "wk-abc" and digest == fingerprint(ca_pem)
    assert env["SHESHNAG_S3_TLS_CA"] == env["SHESHNAG_NATS_TLS_CA"]  # presigned URLs' HTTPS: the same CA
    assert not any(name.startswith("SHESHNAG_S3_") and name != "SHESHNAG_S3_TLS_CA" for name in env)


def test_the_executor_id_chosen_at_first_start_is_kept(tmp_path: Path, ca_pem: str) -> None:
    first, _, _ = join.executor_env(args(tmp_path / "host"), {})
    again, _, _ = join.executor_env(args(tmp_path / "host"), {})
    assert first["SHESHNAG_EXECUTOR_EXECUTOR_ID"] == again["SHESHNAG_EXECUTOR_EXECUTOR_ID"]


def test_a_ca_other_than_the_pinned_one_is_refused(tmp_path: Path, ca_pem: str) -> None:
    with pytest.raises(SystemExit, match="refusing to trust it"):
        join.executor_env(args(tmp_path / "host", ca_sha256="00" * 32), {})
    assert not (tmp_path / "host" / join.CA_FILE).exists()


def test_without_a_worker_key_nothing_is_asked_of_the_gateway(tmp_path: Path, ca_pem: str) -> None:
    with pytest.raises(SystemExit, match="worker key"):
        join.executor_env(args(tmp_path / "host", worker_key=None), {})
