"""The `sheshnag` command: `up` runs the embedded stack; one subcommand per service for deployments; operators' and
users' tools. Only the command given is loaded: its arguments and its run come from its own module, imported when it
is the one asked for, so `sheshnag --help` or `sheshnag keys list` does not load the whole stack."""

import argparse
import asyncio
import importlib
import importlib.metadata
import logging
import os
import signal
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from infra.service_names import SERVICES


def package_version() -> str:
    try:
        return importlib.metadata.version("sheshnag")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def load(target: str) -> Callable[..., Any]:
    """`module:function`, imported now: what a command needs is loaded only when that command runs."""
    module, name = target.split(":")
    function: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return function


def with_stack(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """An operator tool's `--data-dir`: the `sheshnag up` whose stack it acts on (see infra/stack_state.py)."""
    parser.add_argument("--data-dir", type=Path, default=None, help="the data dir of a running `sheshnag up` "
                        "(default: SHESHNAG_NATS_URL when set, else SHESHNAG_DATA_DIR or the default data dir)")
    return parser


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "sheshnag"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sheshnag", description=__doc__)
    parser.add_argument("--version", action="version", version=f"sheshnag {package_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="run broker, object store and all five services on this machine")
    up.add_argument("--data-dir", type=Path, default=default_data_dir(), help="where all state is kept")
    up.add_argument("--port", type=int, default=8080, help="gateway port (default 8080)")
    up.add_argument("--nats-port", type=int, default=None, help="embedded NATS port (default: a free port)")
    up.add_argument("--s3-port", type=int, default=None, help="embedded S3 port (default: a free port)")
    up.add_argument("--listen", default="127.0.0.1", help="the address (this host's IP or DNS name) broker, object "
                    "store and gateway bind and provider hosts reach; any but 127.0.0.1/localhost/::1 puts all three "
                    "behind TLS with a CA generated into the data dir (default 127.0.0.1: this host only)")
    up.add_argument("--config", type=Path, default=None, help="a settings file (TOML, a table per service: "
                    "docs/settings.md) every process of the stack reads; environment variables win over it")
    up.add_argument("--nats-url", default="", help="use this broker instead of starting one: a cluster's client "
                    "URLs, comma-separated, whose accounts are the data dir's (infra/nats_cluster.py)")
    up.add_argument("--webhooks-to-loopback", action="store_true", help="let webhooks go to this host's loopback "
                    "(a local receiver); by default they go to public addresses only (docs/webhooks.md)")
    keys = commands.add_parser("keys", help="manage API keys of a running stack")
    key_tools = keys.add_subparsers(dest="tool", required=True)
    create = with_stack(key_tools.add_parser("create", help="create a key and print it once (only its hash is stored)"))
    create.add_argument("--role", choices=["user", "worker", "admin"], default="user",
                        help="user: the API; worker: executors joining the fleet; admin: the API and operations")
    create.add_argument("--label", default="", help="a name to recognise the key by")
    create.add_argument("--user", default=None, help="the user the key acts for (its model access applies)")
    revoke = with_stack(key_tools.add_parser("revoke", help="revoke a key by its id (key_…); its live batches stop"))
    revoke.add_argument("key_id")
    with_stack(key_tools.add_parser("list", help="every key: id, role, label, user, revoked (never a value)"))
    users = commands.add_parser("users", help="manage users of a running stack")
    user_tools = users.add_subparsers(dest="tool", required=True)
    create_user = with_stack(user_tools.add_parser("create", help="create a user, optionally limited to some models"))
    create_user.add_argument("user_id")
    create_user.add_argument("--name", default="")
    create_user.add_argument("--models", default=None, help="comma-separated catalogue ids (default: every model)")
    create_user.add_argument("--organization", default=None,
                             help="the organisation the user belongs to; it must exist (default: the default one)")
    create_user.add_argument("--role", default="member", choices=["member", "admin"],
                             help="admin: an administrator of the organisation (lists and cancels its members' "
                                  "batches)")
    with_stack(user_tools.add_parser("list", help="every user: id, organisation, role, models"))
    organizations = commands.add_parser("organizations", help="manage organisations of a running stack")
    organization_tools = organizations.add_subparsers(dest="tool", required=True)
    create_organization = with_stack(organization_tools.add_parser("create",
                                                                   help="create an organisation users can join"))
    create_organization.add_argument("organization_id")
    create_organization.add_argument("--name", default="")
    credits = commands.add_parser("credits", help="organisations' billing credit")
    credit_tools = credits.add_subparsers(dest="tool", required=True)
    grant = with_stack(credit_tools.add_parser("grant",
                                               help="credit an organisation (a negative amount takes credit back)"))
    grant.add_argument("organization_id")
    grant.add_argument("amount", help="USD, e.g. 25 or 0.50")
    grant.add_argument("--note", default="")
    show = with_stack(credit_tools.add_parser("show", help="an organisation's balance (default: every account)"))
    show.add_argument("organization_id", nargs="?", default=None)
    chosen = next((arg for arg in argv if not arg.startswith("-")), None)

    def declared_by(target: str, name: str, help_text: str, *extra: object) -> None:
        """A command whose arguments `target` (its own module) declares: loaded only when it is the one given."""
        parser_of = commands.add_parser(name, help=help_text)
        if name == chosen:
            load(target)(parser_of, *extra)

    declared_by("infra.batch_cli:add_arguments", "batch", "run a JSONL file as a batch and download its results "
                "(OPENAI_BASE_URL, OPENAI_API_KEY)")
    status = with_stack(commands.add_parser("status", help="fleet, queue, running batches and consumer lag"))
    status.add_argument("--json", action="store_true", help="one JSON document instead of the terminal view")
    declared_by("infra.nats_config:add_arguments", "nats-config", "write the server config of an operator-run NATS "
                "node or cluster (accounts, auth callout) and the services' env files")
    declared_by("infra.certs:add_arguments", "certs", "the TLS certificate of a `sheshnag up --listen` stack",
                default_data_dir())
    declared_by("infra.models_push:add_arguments", "models", "put model files where executors fetch them")
    declared_by("infra.backup:add_backup_arguments", "backup", "copy streams, objects and the ledger's store into a "
                "folder while the deployment runs")
    declared_by("infra.backup:add_restore_arguments", "restore", "make a backup's streams, objects and ledger store "
                "again in a new data dir or an empty deployment")
    for name in SERVICES:
        service = commands.add_parser(name, help=f"run the {name} against an existing NATS and S3 (SHESHNAG_* env)",
                                      formatter_class=argparse.RawDescriptionHelpFormatter)
        if name != chosen:
            continue
        if {"-h", "--help"} & set(argv):  # its settings are listed in its help alone
            reference = importlib.import_module("infra.settings_reference")
            service.epilog = reference.help_epilog(reference.SERVICE_SETTINGS[name])
        if name == "ledger":
            add_ledger_tools(service)
        if name == "executor":
            load("infra.provider_join:add_arguments")(service)
    return parser.parse_args(argv)


def add_ledger_tools(ledger: argparse.ArgumentParser) -> None:
    """`sheshnag ledger` alone runs the service; these subcommands are the operators' tools."""
    tools = ledger.add_subparsers(dest="tool")
    replay = with_stack(tools.add_parser("replay", help="rebuild every aggregate in a scratch store (from sequence 1, "
                                         "or once the stream is trimmed from the archive's newest snapshot and the "
                                         "stream after it); diff with live"))
    replay.add_argument("--full", action="store_true", help="once the stream is trimmed: fold every archived segment "
                        "instead of starting from the newest snapshot")
    audit = with_stack(tools.add_parser("audit", help="a batch's full timeline from the event log"))
    audit.add_argument("batch_id")
    audit.add_argument("--json", action="store_true", help="JSONL instead of a table")
    with_stack(tools.add_parser("verify", help="recompute the hash chain from the log (archived segments, then the "
                                "stream); report the first sequence that breaks"))
    export = with_stack(tools.add_parser("export", help="events published in a time range, as JSONL"))
    export.add_argument("--since", type=datetime.fromisoformat, default=None, help="ISO-8601 time (inclusive)")
    export.add_argument("--until", type=datetime.fromisoformat, default=None, help="ISO-8601 time (inclusive)")


def run_ledger_tool(args: argparse.Namespace) -> int:
    from services.ledger import operator
    from services.ledger.settings import LedgerSettings

    settings = LedgerSettings()
    match args.tool:
        case "replay":
            return asyncio.run(operator.replay(settings, full=args.full))
        case "audit":
            return asyncio.run(operator.audit(settings, args.batch_id, args.json))
        case "verify":
            return asyncio.run(operator.verify(settings))
        case _:
            since, until = (t if t is None or t.tzinfo else t.replace(tzinfo=UTC) for t in (args.since, args.until))
            return asyncio.run(operator.export(settings, since, until))



STACK_TOOLS = frozenset({"keys", "users", "organizations", "credits", "status", "ledger"})
"""Subcommands that act on a running stack: they find it by `--data-dir` (see infra/stack_state.py)."""


EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE
"""As a process that SIGPIPE ended: the reader of our output went away (`sheshnag batch list | head`)."""


def main(argv: list[str] | None = None) -> None:
    try:
        try:
            command(argv)
        finally:
            sys.stdout.flush()  # here, not at exit: a closed pipe is then ours to catch
    except BrokenPipeError:
        # Quietly, as `cat` or `ls` would; the output left unwritten goes nowhere, also at the interpreter's exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        for stream in (sys.stdout, sys.stderr):
            os.dup2(devnull, stream.fileno())
        sys.exit(EXIT_BROKEN_PIPE)


def command(argv: list[str] | None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.command in STACK_TOOLS and (args.command != "ledger" or args.tool):
        load("infra.stack_state:find_stack")(args.data_dir, default_data_dir())
    try:
        run(args)
    except Exception as error:
        if not refused_by_broker(error):
            raise
        sys.exit(f"sheshnag {args.command}: {error}")


def refused_by_broker(error: Exception) -> bool:
    """The broker could not be reached, or not safely: said in a line, not a traceback (a command that met it has
    these modules loaded already)."""
    from services.runtime.nats.broker import BrokerUnreachable
    from services.runtime.nats.tls import InsecureBrokerUrl

    return isinstance(error, BrokerUnreachable | InsecureBrokerUrl)


def _keys(args: argparse.Namespace) -> None:
    if args.tool == "revoke":
        sys.exit(asyncio.run(load("infra.account_tools:revoke_key_by_id")(args.key_id)))
    asyncio.run(load("infra.account_tools:list_records")("keys") if args.tool == "list"
                else load("infra.account_tools:create_key")(args.role, args.label, args.user))


def _users(args: argparse.Namespace) -> None:
    asyncio.run(load("infra.account_tools:list_records")("users") if args.tool == "list"
                else load("infra.account_tools:create_user")(args.user_id, args.name, args.models, args.organization,
                                                             args.role))


def _credits(args: argparse.Namespace) -> None:
    sys.exit(asyncio.run(load("infra.account_tools:credits_tool")(
        args.tool, args.organization_id, getattr(args, "amount", None), getattr(args, "note", ""))))


def _ledger(args: argparse.Namespace) -> None:
    if not args.tool:
        _service(args)
        return
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    sys.exit(run_ledger_tool(args))


def _executor(args: argparse.Namespace) -> None:
    load("infra.provider_join:join_deployment")(args) if args.deployment else _service(args)


def _service(args: argparse.Namespace) -> None:
    """`sheshnag gateway|validator|scheduler|executor|ledger`: the service in this process."""
    importlib.import_module(f"services.{args.command}.__main__").main()


RUNS: dict[str, Callable[[argparse.Namespace], None]] = {
    "up": lambda args: load("infra.up:main")(args), "keys": _keys, "users": _users, "credits": _credits,
    "ledger": _ledger, "executor": _executor,
    "organizations": lambda args: asyncio.run(load("infra.account_tools:create_organization")(
        args.organization_id, args.name)),
    "batch": lambda args: sys.exit(load("infra.batch_cli:batch_tool")(args, default_data_dir())),
    "status": lambda args: asyncio.run(load("infra.status:status")(args.json)),
    "nats-config": lambda args: sys.exit(load("infra.nats_config:nats_config")(args)),
    "certs": lambda args: sys.exit(load("infra.certs:certs_tool")(args)),
    "models": lambda args: sys.exit(load("infra.models_push:models_tool")(args)),
    "backup": lambda args: sys.exit(load("infra.backup:backup_tool")(args)),
    "restore": lambda args: sys.exit(load("infra.backup:restore_tool")(args)),
}
"""Each command's run; any other is a service run in this process."""


def run(args: argparse.Namespace) -> None:
    RUNS.get(args.command, _service)(args)


if __name__ == "__main__":
    main()
