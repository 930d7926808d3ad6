"""`sheshnag executor --deployment URL --worker-key wk-…`: a provider host joins with those two and nothing else.

It asks the gateway where the broker is and which CA signed its certificate (`GET /v1/provider/connection`),
keeps the CA and this host's executor id in its own data dir, and becomes the executor (`exec`, so the worker
key leaves the command line, which other users can read, and lives on in the process's environment alone). No
S3 credentials and no core broker credentials: objects come through presigned URLs the scheduler signs.
"""

import argparse
import hashlib
import json
import os
import secrets
import socket
import ssl
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import NoReturn

from infra.private import PRIVATE_UMASK, write_private

CONNECTION_PATH = "/v1/provider/connection"
CA_FILE, ID_FILE = "broker-ca.pem", "executor-id"
FETCH_TIMEOUT_S = 15.0


def default_executor_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "sheshnag-executor"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--deployment", default=None, help="the gateway's URL (https://gateway…): join that "
                        "deployment as a provider host; without it, run with SHESHNAG_* env alone")
    parser.add_argument("--worker-key", default=None, help="the wk-… key of the Provider page (or set "
                        "SHESHNAG_EXECUTOR_WORKER_KEY, which no other user of the host can read)")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help=f"where the broker's CA and this executor's id are kept "
                        f"(default {default_executor_dir()})")
    parser.add_argument("--executor-id", default=None, help="this executor's name (default: the host's name and a "
                        "random suffix, chosen once and kept in the data dir)")
    parser.add_argument("--ca-sha256", default=None, help="refuse a broker CA with another SHA-256 (the one "
                        "`sheshnag up` printed): trust that does not rest on the network to the gateway")


def fetch_connection(deployment: str) -> dict[str, object]:
    url = deployment.rstrip("/").removesuffix("/v1") + CONNECTION_PATH
    with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as answer:
        body: dict[str, object] = json.loads(answer.read())
    return body


def ca_sha256(pem: str) -> str:
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem)).hexdigest()


def executor_id(data_dir: Path, chosen: str | None) -> str:
    """`chosen`, else the one kept from the first start (a restarted executor resumes its own durables)."""
    path = data_dir / ID_FILE
    if chosen:
        write_private(path, chosen.encode())
        return chosen
    if path.exists():
        return path.read_text().strip()
    name = "".join(c if c.isalnum() or c in "-_" else "-" for c in socket.gethostname().split(".")[0]) or "host"
    made = f"{name}-{secrets.token_hex(3)}"
    write_private(path, made.encode())
    return made


def fail(message: str) -> NoReturn:
    sys.exit(f"sheshnag executor: {message}")


def executor_env(args: argparse.Namespace, environ: dict[str, str]) -> tuple[dict[str, str], Path, str | None]:
    """The executor's environment, its data dir and the CA's fingerprint (None: the broker needs no CA)."""
    if not args.deployment.startswith(("http://", "https://")):
        fail(f"--deployment must be the gateway's http(s):// URL, not {args.deployment!r}")
    worker_key = args.worker_key or environ.get("SHESHNAG_EXECUTOR_WORKER_KEY", "")
    if not worker_key.startswith("wk-"):
        fail("a worker key (wk-…) is needed: --worker-key, or SHESHNAG_EXECUTOR_WORKER_KEY")
    try:
        connection = fetch_connection(args.deployment)
    except (urllib.error.URLError, OSError, ValueError) as error:
        fail(f"the gateway at {args.deployment} did not say where its broker is ({error})")
    urls, pem = connection.get("nats_urls"), connection.get("tls_ca_pem")
    if not isinstance(urls, list) or not urls or not all(isinstance(u, str) for u in urls):
        fail(f"the gateway at {args.deployment} named no broker")
    data_dir = (args.data_dir or default_executor_dir()).expanduser().resolve()
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    env = dict(environ)
    env.pop("SHESHNAG_NATS_TLS_CA", None)
    digest = None
    if isinstance(pem, str) and pem:
        digest = ca_sha256(pem)
        if args.ca_sha256 and args.ca_sha256.lower().replace(":", "") != digest:
            fail(f"the broker's CA has SHA-256 {digest}, not the {args.ca_sha256} given: refusing to trust it")
        write_private(data_dir / CA_FILE, pem.encode())
        env["SHESHNAG_NATS_TLS_CA"] = str(data_dir / CA_FILE)
    env |= {"SHESHNAG_NATS_URL": ",".join(urls), "SHESHNAG_EXECUTOR_WORKER_KEY": worker_key,
            "SHESHNAG_EXECUTOR_EXECUTOR_ID": executor_id(data_dir, args.executor_id)}
    return env, data_dir, digest


def join_deployment(args: argparse.Namespace) -> NoReturn:
    """Become the executor of the deployment `args.deployment` names; returns only by failing."""
    os.umask(PRIVATE_UMASK)
    env, data_dir, digest = executor_env(args, dict(os.environ))
    trust = f"broker CA sha256 {digest}" if digest else "no broker CA"
    if digest and not args.ca_sha256 and args.deployment.startswith("http://"):
        trust += " (fetched over plain http: compare it with the one `sheshnag up` printed, or pass --ca-sha256)"
    print(f"joining {args.deployment} as {env['SHESHNAG_EXECUTOR_EXECUTOR_ID']}: broker "
          f"{env['SHESHNAG_NATS_URL']}, {trust}; data in {data_dir}", flush=True)
    os.chdir(data_dir)
    os.execve(sys.executable, [sys.executable, "-m", "services.executor"], env)
