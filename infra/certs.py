"""`sheshnag certs rotate`: a new server certificate for a `sheshnag up --listen` stack (broker, gateway and S3
share it), from the data dir's CA, served by the running stack at once without a restart or a dropped line.

The certificate is remade in the data dir; the running `up` (its pid from `stack.json`) is sent SIGHUP, on which
the broker reloads its config and the gateway and the S3 relay their TLS contexts. Open connections carry on.
"""

import argparse
import os
import signal
from pathlib import Path

from infra.stack_state import read_state
from infra.tls import ensure_server_tls, fingerprint, rotate_server_tls, server_names


def add_arguments(parser: argparse.ArgumentParser, default_data_dir: Path) -> None:
    tools = parser.add_subparsers(dest="tool", required=True)
    rotate = tools.add_parser("rotate", help="make a new server certificate from the data dir's CA and have the "
                              "running stack serve it")
    rotate.add_argument("--data-dir", type=Path, default=default_data_dir, help="the stack's data dir")
    rotate.add_argument("--names", nargs="*", default=[], help="more names (IP addresses or DNS names) the new "
                        "certificate is valid for, besides those of the current one and loopback")
    issue = tools.add_parser("issue", help="a deployment's own CA (made once) and one certificate for its NATS nodes "
                             "(client ports and TLS routes) and gateways, valid for --names")
    issue.add_argument("--data-dir", type=Path, required=True, help="where tls/ca.pem, tls/server.pem and their keys "
                       "are written (0600), or read on a later run")
    issue.add_argument("--names", nargs="+", required=True, help="every DNS name or IP address clients and the other "
                       "nodes reach a node by (loopback is added)")


def issue_tool(data_dir: Path, names: list[str]) -> int:
    """The deployment's CA and its servers' certificate (`sheshnag nats-config --tls-cert/--tls-key/--tls-ca`,
    `SHESHNAG_GATEWAY_TLS_CERT/KEY`, `SHESHNAG_NATS_TLS_CA`), kept while it holds every name and is not near its
    end: a second run changes nothing."""
    tls = ensure_server_tls(data_dir, names)
    print(f"certificate {tls.cert} (key {tls.key}) for {', '.join(server_names(tls.cert))}; CA {tls.ca} "
          f"(sha256 {fingerprint(tls.ca_pem())})")
    return 0


def certs_tool(args: argparse.Namespace) -> int:
    data_dir = args.data_dir.expanduser().resolve()
    if args.tool == "issue":
        return issue_tool(data_dir, args.names)
    tls = rotate_server_tls(data_dir, args.names)
    print(f"new certificate {tls.cert} for {', '.join(server_names(tls.cert))}; CA {tls.ca} "
          f"(sha256 {fingerprint(tls.ca_pem())}, unchanged)")
    state = read_state(data_dir)
    if state is None or not state.alive():
        print("no stack runs from this data dir: its next `sheshnag up` serves the new certificate")
        return 0
    os.kill(state.pid, signal.SIGHUP)
    print(f"the running stack (pid {state.pid}) now serves it: broker, gateway and S3 reload it")
    return 0
