"""`sheshnag nats-config`: what it writes is a config the real nats-server accepts (`-t`), with the accounts and auth
callout the services expect, the routes of a cluster, and env files that match it."""

import os
import stat
import subprocess
from pathlib import Path

import pytest

from infra.cli import parse_args
from infra.embedded import venv_binary
from infra.nats_auth import NatsAuth
from infra.nats_config import nats_config
from services.authz.keyring import CalloutKeys
from tests.certificates import write_tls_files


def run_nats_config(tmp_path: Path, *options: str, out: str = "nats.conf") -> str:
    args = parse_args(["nats-config", "--data-dir", str(tmp_path / "secrets"), "--out", str(tmp_path / out),
                       "--store-dir", str(tmp_path / "jetstream"), *options])
    assert nats_config(args) == 0
    return (tmp_path / out).read_text()


def server_accepts(config: Path, unset: str = "", **environment: str) -> subprocess.CompletedProcess[str]:
    """`nats-server -t`: parse the file as the server would start with it (TLS files loaded too), then exit."""
    env = {name: value for name, value in os.environ.items() if name != unset} | environment
    return subprocess.run([venv_binary("nats-server"), "-c", str(config), "-t"], capture_output=True, text=True,
                          timeout=30, env=env)


def test_a_single_node_config_is_one_the_server_accepts(tmp_path: Path) -> None:
    run_nats_config(tmp_path, "--server-name", "nats-1", "--listen", "127.0.0.1:4222", "--monitor", "127.0.0.1:8222")
    checked = server_accepts(tmp_path / "nats.conf")
    assert checked.returncode == 0, checked.stderr
    assert "is valid" in checked.stderr


def test_it_carries_the_core_user_the_system_account_and_the_auth_callout_the_services_expect(tmp_path: Path) -> None:
    config = run_nats_config(tmp_path, "--server-name", "nats-1")
    auth = NatsAuth.load_or_create(tmp_path / "secrets")
    keys = CalloutKeys(auth.issuer_seed)
    assert f'issuer: "{keys.issuer}"' in config
    assert f'xkey: "{keys.curve.public_key}"' in config
    assert f'{{ user: "core", password: "{auth.core_password}" }}' in config
    assert f'SYS {{ users: [ {{ user: "system", password: "{keys.system_password}" }} ] }}' in config
    assert "system_account: SYS" in config
    # The very layout the embedded broker runs with: one text, not two that could drift apart.
    assert auth.authorization() in config
    assert auth.authorization() in auth.write_server_config(tmp_path / "secrets").read_text()


def test_the_config_file_is_private(tmp_path: Path) -> None:
    run_nats_config(tmp_path, "--server-name", "nats-1")
    assert stat.S_IMODE((tmp_path / "nats.conf").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "secrets" / "nats-auth.json").stat().st_mode) == 0o600


def test_a_cluster_config_names_every_route_with_the_route_password(tmp_path: Path) -> None:
    routes = "nats-1:6222,nats-2:6222,nats-3:6222"
    config = run_nats_config(tmp_path, "--server-name", "nats-2", "--cluster-name", "sheshnag", "--routes", routes)
    password = NatsAuth.load_or_create(tmp_path / "secrets").route_password
    for host in ("nats-1", "nats-2", "nats-3"):
        assert f'"nats-route://route:{password}@{host}:6222"' in config
    assert f'authorization {{ user: "route", password: "{password}", timeout: 2 }}' in config
    assert 'name: "sheshnag"' in config and "no_advertise: true" in config
    assert 'server_name: "nats-2"' in config
    checked = server_accepts(tmp_path / "nats.conf")
    assert checked.returncode == 0, checked.stderr


def test_every_node_generated_from_one_data_dir_shares_its_secrets(tmp_path: Path) -> None:
    first = run_nats_config(tmp_path, "--server-name", "nats-1", "--cluster-name", "c", "--routes", "a:6222,b:6222",
                            out="nats-1.conf")
    second = run_nats_config(tmp_path, "--server-name", "nats-2", "--cluster-name", "c", "--routes", "a:6222,b:6222",
                             out="nats-2.conf")
    assert first.replace('"nats-1"', '"nats-2"') == second


def test_a_server_name_given_as_a_variable_is_resolved_from_each_nodes_environment(tmp_path: Path) -> None:
    config = run_nats_config(tmp_path, "--server-name", "$SERVER_NAME", "--cluster-name", "sheshnag",
                             "--routes", "nats-0:6222,nats-1:6222,nats-2:6222")
    assert "server_name: $SERVER_NAME\n" in config
    resolved = server_accepts(tmp_path / "nats.conf", SERVER_NAME="nats-0")
    assert resolved.returncode == 0, resolved.stderr
    unset = server_accepts(tmp_path / "nats.conf", unset="SERVER_NAME")
    assert unset.returncode != 0 and "SERVER_NAME" in unset.stderr


def test_with_tls_files_clients_and_routes_use_tls_and_the_server_loads_them(tmp_path: Path) -> None:
    tls = write_tls_files(tmp_path)
    config = run_nats_config(tmp_path, "--server-name", "nats-1", "--cluster-name", "sheshnag",
                             "--routes", "127.0.0.1:6222", "--tls-cert", str(tls.cert), "--tls-key", str(tls.key),
                             "--tls-ca", str(tls.ca))
    client_tls, _, cluster = config.partition("cluster {")
    assert f'cert_file: "{tls.cert}"' in client_tls and "ca_file" not in client_tls
    assert f'ca_file: "{tls.ca}"' in cluster and "verify: true" in cluster
    checked = server_accepts(tmp_path / "nats.conf")
    assert checked.returncode == 0, checked.stderr


def test_a_certificate_that_is_not_there_is_refused_by_the_server_check(tmp_path: Path) -> None:
    run_nats_config(tmp_path, "--server-name", "nats-1", "--tls-cert", str(tmp_path / "missing.pem"),
                    "--tls-key", str(tmp_path / "missing-key.pem"))
    checked = server_accepts(tmp_path / "nats.conf")
    assert checked.returncode != 0 and "missing.pem" in checked.stderr


def test_the_env_files_give_the_services_the_core_url_and_the_scheduler_the_callout_seed(tmp_path: Path) -> None:
    run_nats_config(tmp_path, "--server-name", "nats-1", "--env-dir", str(tmp_path / "env"),
                    "--url", "tls://nats.example.net:4222")
    auth = NatsAuth.load_or_create(tmp_path / "secrets")
    core, callout = (tmp_path / "env" / "core.env"), (tmp_path / "env" / "callout.env")
    assert f"SHESHNAG_NATS_URL=tls://core:{auth.core_password}@nats.example.net:4222\n" in core.read_text()
    assert f"SHESHNAG_NATS_CALLOUT_SEED={auth.issuer_seed}\n" in callout.read_text()
    assert "CALLOUT" not in core.read_text()
    assert {stat.S_IMODE(path.stat().st_mode) for path in (core, callout)} == {0o600}


def test_each_of_several_urls_gets_the_core_user(tmp_path: Path) -> None:
    run_nats_config(tmp_path, "--server-name", "nats-1", "--env-dir", str(tmp_path / "env"),
                    "--url", "nats://nats-1:4222, nats://nats-2:4222")
    password = NatsAuth.load_or_create(tmp_path / "secrets").core_password
    assert (f"SHESHNAG_NATS_URL=nats://core:{password}@nats-1:4222,nats://core:{password}@nats-2:4222\n"
            in (tmp_path / "env" / "core.env").read_text())


@pytest.mark.parametrize("options", [
    ["--cluster-name", "sheshnag"],
    ["--routes", "a:6222"],
    ["--tls-cert", "server.pem"],
    ["--tls-ca", "ca.pem"],
    ["--env-dir", "env", "--url", "http://nats:4222"],
])
def test_options_that_do_not_make_a_server_are_refused_and_nothing_is_written(tmp_path: Path,
                                                                              options: list[str]) -> None:
    args = parse_args(["nats-config", "--data-dir", str(tmp_path / "secrets"), "--out", str(tmp_path / "nats.conf"),
                       "--server-name", "nats-1", *[str(tmp_path / o) if o == "env" else o for o in options]])
    assert nats_config(args) == 2
    assert not (tmp_path / "nats.conf").exists()
