"""The state file `sheshnag up` keeps in its data dir while it runs (`stack.json`: pid, ports, broker URL without
credentials, paths), and how the operator tools find their stack from it.

The tools (`status`, `keys`, `users`, `organizations`, `credits`, `ledger …`) use, in order: `--data-dir`; else a
deployment's `SHESHNAG_NATS_URL` when set; else `SHESHNAG_DATA_DIR` or the default data dir. A data dir without a
running stack is a clear error naming the command that starts one, never a guess at `127.0.0.1:4222`.
Credentials are not in the state file: they stay in the data dir's own 0600 files and are read from there.
"""

import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from infra.embedded import S3Credentials, storage_paths
from infra.nats_auth import NatsAuth
from infra.nats_config import core_url

STATE_FILE = "stack.json"


@dataclass(frozen=True)
class StackState:
    pid: int
    """The `sheshnag up` process."""
    gateway_url: str
    nats_url: str
    """Without credentials; the core user's are in the data dir's `nats-auth.json`."""
    s3_endpoint: str
    ledger_db_path: str
    nats_tls_ca: str | None = None
    started_at: int = 0

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except (ProcessLookupError, PermissionError):  # PermissionError: someone else's process has the pid
            return False
        return True

    def tool_env(self, data_dir: Path) -> dict[str, str]:
        """What an operator tool's settings read to reach this stack as its services do."""
        credentials = S3Credentials.load_or_create(data_dir / "s3-credentials.json")
        env = {"SHESHNAG_NATS_URL": core_url(NatsAuth.load_or_create(data_dir), self.nats_url),
               "SHESHNAG_S3_ENDPOINT": self.s3_endpoint, "SHESHNAG_S3_ACCESS_KEY": credentials.access_key,
               "SHESHNAG_S3_SECRET_KEY": credentials.secret_key, "SHESHNAG_LEDGER_DB_PATH": self.ledger_db_path,
               "SHESHNAG_STORAGE_PATHS": storage_paths(data_dir, own_broker=(data_dir / "nats").is_dir())}
        if self.nats_tls_ca:
            env["SHESHNAG_NATS_TLS_CA"] = self.nats_tls_ca
        return env


def write_state(data_dir: Path, state: StackState) -> None:
    path = data_dir / STATE_FILE
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps({**asdict(state), "started_at": state.started_at or int(time.time())}, indent=2))
    partial.replace(path)


def remove_state(data_dir: Path, pid: int) -> None:
    """Remove the state file if it is this process's (a second `up` on the same dir may have written its own)."""
    found = read_state(data_dir)
    if found is not None and found.pid == pid:
        (data_dir / STATE_FILE).unlink(missing_ok=True)


def read_state(data_dir: Path) -> StackState | None:
    try:
        return StackState(**json.loads((data_dir / STATE_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def find_stack(data_dir: Path | None, default_data_dir: Path) -> None:
    """Point this process's settings at the stack the tool is for (see the module's docstring); exit with a clear
    message when there is none."""
    if data_dir is None and os.environ.get("SHESHNAG_NATS_URL"):
        return  # a deployment's broker, named by the operator
    chosen = (data_dir or Path(os.environ.get("SHESHNAG_DATA_DIR") or default_data_dir)).expanduser().resolve()
    state = read_state(chosen)
    if state is None or not state.alive():
        why = "has no running stack" if state is None else f"names a stack (pid {state.pid}) that is not running"
        sys.exit(f"sheshnag: {chosen} {why}. Start one with `sheshnag up --data-dir {chosen}`, pass --data-dir "
                 "for another, or set SHESHNAG_NATS_URL to reach a deployed broker.")
    os.environ.update(state.tool_env(chosen))
