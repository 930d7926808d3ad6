"""`infra/deploy/make-secrets.sh` writes what the compose file and the manifests read: every env file they name, a
NATS config the real server accepts for each of their nodes with routes to exactly those nodes, 0600 files, and the
same secrets on a second run."""

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import yaml

from infra.embedded import venv_binary

DEPLOY = Path(__file__).resolve().parents[3] / "infra" / "deploy"
ROUTE = re.compile(r'"nats-route://route:[0-9a-f]+@([^"]+)"')


def make_secrets(tmp_path: Path, target: str) -> Path:
    """The script run as an operator runs it, from a copy (it writes beside itself), with the venv's CLI; run
    twice, as an operator may, the second run keeping every secret."""
    shutil.copy(DEPLOY / "make-secrets.sh", tmp_path / "make-secrets.sh")
    cli = str(Path(sys.executable).parent / "sheshnag")
    secrets = tmp_path / target / "secrets"
    runs = []
    for _ in range(2):
        subprocess.run(["bash", str(tmp_path / "make-secrets.sh"), target], check=True, capture_output=True,
                       timeout=120, env={**os.environ, "CLI": cli})
        runs.append({path.name: path.read_bytes() for path in secrets.iterdir() if path.is_file()})
    assert runs[0] == runs[1]
    return secrets


def server_accepts(config: Path, server_name: str) -> None:
    """`nats-server -t` on the config, the certificates it names in the container read from secrets/tls/."""
    local = config.parent.parent / f"{config.stem}-local.conf"  # beside secrets/, which holds 0600 files alone
    local.write_text(config.read_text().replace("/etc/nats/tls/", f"{config.parent / 'tls'}/")
                     .replace("/etc/nats-tls/", f"{config.parent / 'tls'}/"))
    checked = subprocess.run([venv_binary("nats-server"), "-c", str(local), "-t"], capture_output=True, text=True,
                             timeout=30, env={**os.environ, "SERVER_NAME": server_name})
    assert checked.returncode == 0, checked.stderr


def test_the_compose_secrets_are_every_env_file_the_compose_file_reads_and_a_config_for_each_node(
        tmp_path: Path) -> None:
    secrets = make_secrets(tmp_path, "compose")
    services = yaml.safe_load((DEPLOY / "compose" / "compose.yaml").read_text())["services"]
    named = {Path(file).name for service in services.values() for file in service.get("env_file", [])}
    assert named <= {path.name for path in secrets.iterdir()}
    nodes = sorted(name for name in services if name.startswith("nats-"))
    config = (secrets / "nats.conf").read_text()
    assert sorted(route.removesuffix(":6222") for route in ROUTE.findall(config)) == nodes
    for node in nodes:
        assert services[node]["environment"]["SERVER_NAME"] == node
        server_accepts(secrets / "nats.conf", node)
    assert "=tls://core:" in (secrets / "core.env").read_text() and "@nats:4222" in (secrets / "core.env").read_text()
    assert 'handshake_first: "300ms"' in config and "verify: true" in config  # TLS first; routes verified
    assert {"SHESHNAG_NATS_PRIVATE_HOSTS"} & {key for service in services.values()
                                              for key in service.get("environment", {})} == set()
    assert all(f"./secrets/tls/ca.pem:{services[name]['environment']['SHESHNAG_NATS_TLS_CA']}:ro"
               in services[name]["volumes"] for name in ("gateway", "validator", "scheduler", "ledger", "executor"))
    assert all("nats" in services[node]["networks"]["default"]["aliases"] for node in nodes)
    assert {stat.S_IMODE(path.stat().st_mode) for path in secrets.iterdir() if path.is_file()} == {0o600}


def test_the_kubernetes_secrets_route_to_the_statefulsets_pods_and_fill_every_secret_the_manifests_read(
        tmp_path: Path) -> None:
    secrets = make_secrets(tmp_path, "kubernetes")
    documents = [document for path in sorted((DEPLOY / "kubernetes").glob("*.yaml"))
                 for document in yaml.safe_load_all(path.read_text()) if document]
    (nats,) = [d for d in documents if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "sheshnag-nats"]
    pods = [f"sheshnag-nats-{index}.{nats['spec']['serviceName']}" for index in range(nats["spec"]["replicas"])]
    config = (secrets / "nats.conf").read_text()
    assert sorted(route.removesuffix(":6222") for route in ROUTE.findall(config)) == pods
    server_accepts(secrets / "nats.conf", "sheshnag-nats-0")
    apply = (DEPLOY / "kubernetes" / "apply-secrets.sh").read_text()
    (pairs,) = re.findall(r"^for pair in (.*); do$", apply, re.MULTILINE)
    env_files = dict(pair.split(":") for pair in pairs.split())
    created = {f"sheshnag-{name}" for name in env_files} | set(re.findall(r"^apply (sheshnag-[a-z0-9-]+) --from-file",
                                                                          apply, re.MULTILINE))
    assert {"sheshnag-nats-config", "sheshnag-nats-tls", "sheshnag-ca"} <= created
    # Every hop TLS: the services' URL is tls://, the nodes' config TLS first, their certificate names the Service.
    assert re.search(r"^SHESHNAG_NATS_URL=tls://core:[^@]+@sheshnag-nats:4222$", (secrets / "core.env").read_text(),
                     re.MULTILINE)
    assert "handshake_first" in config
    read = {name for path in (DEPLOY / "kubernetes").glob("*.yaml")
            for name in re.findall(r"(?:secretName|secretRef: \{ name|secretKeyRef: \{ name): (sheshnag-[a-z0-9-]+)",
                                   path.read_text())}
    assert read and read <= created
    assert all((secrets / f"{file}.env").is_file() for file in env_files.values())
