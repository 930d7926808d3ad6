"""`sheshnag nats-config`: the server configuration of an operator-run NATS (one node, or the nodes of a cluster)
with the accounts, core user and auth callout the services expect (`NatsAuth.authorization`, the same text the
embedded broker runs with), and the env files that hand the services the matching secrets."""

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from infra.nats_auth import CORE_USER, SECRETS_FILE, NatsAuth
from infra.private import write_private

ROUTE_USER = "route"
VARIABLE = re.compile(r"\$[A-Za-z_][A-Za-z0-9_]*")
"""A value written as `$NAME` stays a reference the server resolves from its environment when it starts: one
file serves every node of a cluster (`--server-name '$SERVER_NAME'`)."""
CORE_ENV, CALLOUT_ENV = "core.env", "callout.env"
HANDSHAKE_FIRST_WAIT = "300ms"


@dataclass(frozen=True)
class Tls:
    cert: str
    key: str
    ca: str | None = None
    """With a CA, routes use TLS too: each node presents `cert` to the others and verifies theirs against it."""


@dataclass(frozen=True)
class Cluster:
    name: str
    routes: tuple[str, ...]
    """`host:port` of every node's cluster port, this node's own included (a node ignores the route to itself)."""
    listen: str = "0.0.0.0:6222"


@dataclass(frozen=True)
class ServerLayout:
    server_name: str
    listen: str = "0.0.0.0:4222"
    store_dir: str = "/data/jetstream"
    tls: Tls | None = None
    cluster: Cluster | None = None
    monitor: str | None = None
    """host:port of the monitoring endpoint (`/healthz`, `/varz`; no authentication: keep it off public networks)."""
    pid_file: str | None = None
    lame_duck_s: int = 30
    """On `nats-server --signal ldm`, clients are moved off over this long (a rolling restart)."""


def _value(text: str) -> str:
    return text if VARIABLE.fullmatch(text) else json.dumps(text)


def _tls_block(tls: Tls, indent: str, peers: bool) -> list[str]:
    lines = [f"{indent}tls {{", f"{indent}  cert_file: {_value(tls.cert)}", f"{indent}  key_file: {_value(tls.key)}"]
    if peers and tls.ca:
        lines += [f"{indent}  ca_file: {_value(tls.ca)}", f"{indent}  verify: true"]
    if not peers:
        # Sheshnag's clients start TLS before the server speaks (services/runtime/nats/tls.py); others are
        # answered the classic way (INFO, then the upgrade) once they have said nothing for this long.
        lines.append(f'{indent}  handshake_first: "{HANDSHAKE_FIRST_WAIT}"')
    return [*lines, f"{indent}  timeout: 2", f"{indent}}}"]


def client_tls(cert: str, key: str) -> str:
    """The client port's `tls` block of a broker that requires TLS (TLS first, or the classic upgrade)."""
    return "\n".join(_tls_block(Tls(cert, key), "", peers=False)) + "\n"


def _cluster_block(auth: NatsAuth, cluster: Cluster, tls: Tls | None) -> list[str]:
    routes = [f"nats-route://{ROUTE_USER}:{auth.route_password}@{route}" for route in cluster.routes]
    lines = [
        "cluster {",
        f"  name: {_value(cluster.name)}",
        f"  listen: {_value(cluster.listen)}",
        f'  authorization {{ user: "{ROUTE_USER}", password: "{auth.route_password}", timeout: 2 }}',
        "  routes: [",
        *(f"    {json.dumps(route)}" for route in routes),
        "  ]",
        # Clients keep to the URL they were given (a DNS name or Service in front of every node): the services'
        # URL carries the core user's credentials, which URLs the servers would advertise do not.
        "  no_advertise: true",
    ]
    if tls is not None and tls.ca:
        lines += _tls_block(tls, "  ", peers=True)
    return [*lines, "}"]


def server_config(auth: NatsAuth, layout: ServerLayout) -> str:
    """The whole `nats-server -c` file of one node; with `$NAME` values, of every node alike."""
    lines = [
        f"# Written by `sheshnag nats-config` from {SECRETS_FILE}: every node of the deployment gets the same",
        "# accounts and auth callout. It holds passwords: keep it 0600.",
        f"server_name: {_value(layout.server_name)}",
        f"listen: {_value(layout.listen)}",
        f"jetstream {{ store_dir: {_value(layout.store_dir)} }}",
        f'lame_duck_duration: "{layout.lame_duck_s}s"',
    ]
    if layout.pid_file:
        lines.append(f"pid_file: {_value(layout.pid_file)}")
    if layout.monitor:
        lines.append(f"http: {_value(layout.monitor)}")
    if layout.tls is not None:
        lines += _tls_block(layout.tls, "", peers=False)
    if layout.cluster is not None:
        lines += _cluster_block(auth, layout.cluster, layout.tls)
    return "\n".join(lines) + "\n" + auth.authorization()


def core_url(auth: NatsAuth, url: str) -> str:
    """`url` (how the services reach the broker: `nats://host:4222` or `tls://…`, several comma-separated) with the
    core user in each."""
    with_user = []
    for one in url.split(","):
        parts = urlsplit(one.strip())
        if parts.scheme not in ("nats", "tls") or not parts.hostname:
            raise ValueError(f"{one!r} is not a nats:// or tls:// URL")
        host = parts.netloc.rpartition("@")[2]
        with_user.append(urlunsplit(parts._replace(netloc=f"{CORE_USER}:{auth.core_password}@{host}")))
    return ",".join(with_user)


def write_env_files(auth: NatsAuth, url: str, env_dir: Path) -> list[Path]:
    """`core.env` for every service but the executor; `callout.env` for the scheduler alone. Both 0600."""
    files = {
        CORE_ENV: ("The services' broker URL, the core user's password in it (not for executors: they connect\n"
                   "# with their id and worker key).", f"SHESHNAG_NATS_URL={core_url(auth, url)}"),
        CALLOUT_ENV: ("The auth callout issuer's seed: the scheduler's alone (it admits executors by worker key).",
                      f"SHESHNAG_NATS_CALLOUT_SEED={auth.issuer_seed}"),
    }
    env_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    written = []
    for name, (comment, line) in files.items():
        path = env_dir / name
        write_private(path, f"# Written by `sheshnag nats-config` from {SECRETS_FILE}. {comment}\n{line}\n".encode())
        written.append(path)
    return written


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", type=Path, required=True,
                        help=f"where {SECRETS_FILE} is read, or made (0600) the first time: give every node the same")
    parser.add_argument("--out", type=Path, required=True, help="the config file to write (0600)")
    parser.add_argument("--server-name", required=True,
                        help="this node's unique name; '$VAR' is resolved from the server's environment")
    parser.add_argument("--listen", default="0.0.0.0:4222", help="client host:port (default 0.0.0.0:4222)")
    parser.add_argument("--store-dir", default="/data/jetstream", help="JetStream store directory")
    parser.add_argument("--cluster-name", default=None, help="cluster this node joins (with --routes)")
    parser.add_argument("--cluster-listen", default="0.0.0.0:6222", help="route host:port (default 0.0.0.0:6222)")
    parser.add_argument("--routes", default="", help="comma-separated host:port of every node's cluster port")
    parser.add_argument("--tls-cert", default=None, help="server certificate (PEM): clients must use TLS")
    parser.add_argument("--tls-key", default=None, help="its private key (PEM)")
    parser.add_argument("--tls-ca", default=None, help="CA of the nodes' certificates: routes use TLS as well")
    parser.add_argument("--monitor", default=None, help="host:port of the unauthenticated monitoring endpoint")
    parser.add_argument("--pid-file", default=None, help="for `nats-server --signal ldm=<pid file>`")
    parser.add_argument("--env-dir", type=Path, default=None,
                        help=f"also write {CORE_ENV} and {CALLOUT_ENV} (0600) for the services here")
    parser.add_argument("--url", default="nats://127.0.0.1:4222",
                        help=f"how the services reach the broker, for {CORE_ENV}: a URL, or several comma-separated "
                        "(default nats://127.0.0.1:4222)")


def layout_from(args: argparse.Namespace) -> ServerLayout:
    routes = tuple(route.strip() for route in args.routes.split(",") if route.strip())
    if bool(args.cluster_name) != bool(routes):
        raise ValueError("--cluster-name and --routes go together")
    if bool(args.tls_cert) != bool(args.tls_key) or (args.tls_ca and not args.tls_cert):
        raise ValueError("--tls-cert and --tls-key go together (and --tls-ca needs them)")
    return ServerLayout(
        server_name=args.server_name, listen=args.listen, store_dir=args.store_dir, monitor=args.monitor,
        pid_file=args.pid_file,
        tls=Tls(args.tls_cert, args.tls_key, args.tls_ca) if args.tls_cert else None,
        cluster=Cluster(args.cluster_name, routes, args.cluster_listen) if routes else None,
    )


def nats_config(args: argparse.Namespace) -> int:
    """Write the config (and env files); say where, never what: the files hold the secrets."""
    try:
        layout = layout_from(args)
        data_dir = args.data_dir.expanduser()
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        auth = NatsAuth.load_or_create(data_dir)
        written = write_env_files(auth, args.url, args.env_dir) if args.env_dir else []
    except ValueError as error:
        print(f"sheshnag nats-config: {error}", file=sys.stderr)
        return 2
    write_private(args.out, server_config(auth, layout).encode())
    for path in (args.out, *written):
        print(f"wrote {path}")
    return 0
