"""`sheshnag executor --deployment URL --worker-key wk-…`: a provider host joins with those two and nothing else.

It asks the gateway where the broker is and which CA signed its certificate (`GET /v1/provider/connection`),
keeps the CA and this host's executor id in its own data dir, and becomes the executor (`exec`, so the worker
key leaves the command line, which other users can read, and lives on in the process's environment alone). No
S3 credentials and no core broker credentials: objects come through presigned URLs the scheduler signs.

The worker key goes only where it is safe: the gateway must prove it is the deployment's (https:// off this host,
its certificate chained to the CA `--ca-sha256` pins, else to one of the system's), and the broker it names must be
`tls://` (then verified against the CA the gateway gave, TLS first: services/runtime/nats/tls.py).
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
from urllib.parse import urlsplit

from infra.private import PRIVATE_UMASK, write_private
from services.runtime.nats.tls import InsecureBrokerUrl, is_local_host, require_tls

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
    parser.add_argument("--ca-sha256", default=None, help="the deployment CA's SHA-256 (the one `sheshnag up` "
                        "printed): the gateway's certificate and the broker's must chain to it, else nothing is "
                        "sent; trust that does not rest on the network to the gateway")


def _get(url: str, context: ssl.SSLContext | None) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S, context=context) as answer:
        body: dict[str, object] = json.loads(answer.read())
    return body


def _unverified() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def fetch_connection(deployment: str, pin: str | None) -> dict[str, object]:
    """The gateway's answer, from a gateway whose certificate was verified: chained to the CA whose SHA-256 is
    `pin` (that CA is learnt from the gateway, unverified, checked against the pin, then the answer is asked again
    over a connection verified by it), else to a CA of the system's; unverified only on this host (as over http).
    Nothing secret is sent: the worker key goes to the broker the answer names, once it is trusted."""
    url = deployment.rstrip("/").removesuffix("/v1") + CONNECTION_PATH
    parts = urlsplit(url)
    if parts.scheme == "http":
        return _get(url, None)
    if pin is None:
        return _get(url, _unverified() if is_local_host(parts.hostname) else None)
    pem = _get(url, _unverified()).get("tls_ca_pem")
    if not isinstance(pem, str) or not pem:
        fail(f"the gateway at {deployment} names no CA, but --ca-sha256 was given: refusing it")
    pinned(pem, pin)
    return _get(url, ssl.create_default_context(cadata=pem))


def ca_sha256(pem: str) -> str:
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem)).hexdigest()


def pinned(pem: str, pin: str) -> str:
    """`pem`'s SHA-256, which must be `pin`."""
    digest = ca_sha256(pem)
    if digest != pin:
        fail(f"the deployment's CA has SHA-256 {digest}, not the {pin} given: refusing to trust it")
    return digest


def normalized_pin(given: str | None) -> str | None:
    if given is None:
        return None
    pin = given.lower().replace(":", "")
    if len(pin) != 64 or any(c not in "0123456789abcdef" for c in pin):
        fail(f"--ca-sha256 must be a SHA-256 in hex (64 digits, colons allowed), not {given!r}")
    return pin


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
    deployment = urlsplit(args.deployment)
    if deployment.scheme not in ("http", "https") or not deployment.hostname:
        fail(f"--deployment must be the gateway's https:// URL, not {args.deployment!r}")
    if deployment.scheme == "http" and not is_local_host(deployment.hostname):
        fail(f"--deployment {args.deployment} is plain http to another host: whoever answers there could name a "
             "broker of its own and be sent the worker key. Use the gateway's https:// URL (with --ca-sha256, the "
             "CA SHA-256 `sheshnag up` printed, when its certificate is the deployment's own)")
    worker_key = args.worker_key or environ.get("SHESHNAG_EXECUTOR_WORKER_KEY", "")
    if not worker_key.startswith("wk-"):
        fail("a worker key (wk-…) is needed: --worker-key, or SHESHNAG_EXECUTOR_WORKER_KEY")
    pin = normalized_pin(args.ca_sha256)
    try:
        connection = fetch_connection(args.deployment, pin)
    except urllib.error.URLError as error:
        if isinstance(error.reason, ssl.SSLCertVerificationError):
            trusted = "the CA --ca-sha256 pins" if pin else "a CA this host trusts (pass --ca-sha256)"
            fail(f"the gateway at {args.deployment} did not prove who it is: its certificate is not from {trusted} "
                 f"({error.reason.verify_message}); the worker key was not sent anywhere")
        fail(f"the gateway at {args.deployment} did not say where its broker is ({error})")
    except (OSError, ValueError) as error:
        fail(f"the gateway at {args.deployment} did not say where its broker is ({error})")
    urls, pem = connection.get("nats_urls"), connection.get("tls_ca_pem")
    if not isinstance(urls, list) or not urls or not all(isinstance(u, str) for u in urls):
        fail(f"the gateway at {args.deployment} named no broker")
    try:
        require_tls(urls, f"the gateway at {args.deployment}")
    except InsecureBrokerUrl as error:
        fail(f"{error}; the worker key was not sent")
    if pin and not (isinstance(pem, str) and pem):
        fail(f"the gateway at {args.deployment} names no CA, but --ca-sha256 was given: refusing it")
    data_dir = (args.data_dir or default_executor_dir()).expanduser().resolve()
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    env = dict(environ)
    for inherited in ("SHESHNAG_NATS_TLS_CA", "SHESHNAG_NATS_PRIVATE_HOSTS"):  # the gateway's answer alone decides
        env.pop(inherited, None)
    digest = None
    if isinstance(pem, str) and pem:
        digest = pinned(pem, pin) if pin else ca_sha256(pem)
        write_private(data_dir / CA_FILE, pem.encode())
        env["SHESHNAG_NATS_TLS_CA"] = str(data_dir / CA_FILE)
        env["SHESHNAG_S3_TLS_CA"] = str(data_dir / CA_FILE)  # presigned URLs' HTTPS: trusted besides the system's
    env |= {"SHESHNAG_NATS_URL": ",".join(urls), "SHESHNAG_EXECUTOR_WORKER_KEY": worker_key,
            "SHESHNAG_EXECUTOR_EXECUTOR_ID": executor_id(data_dir, args.executor_id)}
    return env, data_dir, digest


def join_deployment(args: argparse.Namespace) -> NoReturn:
    """Become the executor of the deployment `args.deployment` names; returns only by failing."""
    os.umask(PRIVATE_UMASK)
    env, data_dir, digest = executor_env(args, dict(os.environ))
    trust = f"broker CA sha256 {digest}" if digest else "the system's CAs"
    if digest and not args.ca_sha256 and args.deployment.startswith("http://"):
        trust += " (fetched over plain http on this host: compare it with the one `sheshnag up` printed)"
    print(f"joining {args.deployment} as {env['SHESHNAG_EXECUTOR_EXECUTOR_ID']}: broker "
          f"{env['SHESHNAG_NATS_URL']}, {trust}; data in {data_dir}", flush=True)
    os.chdir(data_dir)
    os.execve(sys.executable, [sys.executable, "-m", "services.executor"], env)
