"""Where `sheshnag batch` finds its stack and key when the OpenAI SDK's settings do not say: the data dir of a running
`sheshnag up` (`--data-dir`, else `SHESHNAG_DATA_DIR`, else the default), as the operator tools find theirs.

The key: `SHESHNAG_ADMIN_KEY` when set (the key `up` registers), else the data dir's own CLI key, made once with the
data dir's broker credentials (as `sheshnag keys create --role admin` makes one) and kept in the data dir (0600),
as the embedded executor's worker key is: whoever reads the data dir holds the broker's credentials anyway.
"""

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path

from infra.account_tools import accounts
from infra.stack_state import StackState, read_state
from services.gateway.usecases.accounts import create_key

CLI_KEY_FILE = "cli-api-key"
CLI_KEY_LABEL = "sheshnag batch (data dir)"


class NoLocalStack(Exception):
    """The data dir has no running stack: the message says which dir and how to start one."""


@dataclass(frozen=True)
class LocalStack:
    data_dir: Path
    state: StackState

    @property
    def base_url(self) -> str:
        return self.state.gateway_url + "/v1"


def chosen_data_dir(data_dir: Path | None, default_data_dir: Path) -> Path:
    return (data_dir or Path(os.environ.get("SHESHNAG_DATA_DIR") or default_data_dir)).expanduser().resolve()


def local_stack(data_dir: Path) -> LocalStack:
    state = read_state(data_dir)
    if state is None or not state.alive():
        why = "has no running stack" if state is None else f"names a stack (pid {state.pid}) that is not running"
        raise NoLocalStack(f"{data_dir} {why}: start one with `sheshnag up --data-dir {data_dir}`, pass --data-dir "
                           "for another, or set OPENAI_BASE_URL (e.g. http://127.0.0.1:8080/v1)")
    return LocalStack(data_dir, state)


async def _make_key(stack: LocalStack) -> str:
    os.environ.update(stack.state.tool_env(stack.data_dir))
    async with accounts("sheshnag-batch") as ports:
        raw, _ = await create_key(ports, "admin", CLI_KEY_LABEL)
    return raw


def local_api_key(stack: LocalStack) -> str:
    """The key for the local stack (see the module's docstring); made and kept on first use."""
    if chosen := os.environ.get("SHESHNAG_ADMIN_KEY"):
        return chosen
    path = stack.data_dir / CLI_KEY_FILE
    if path.exists():
        return path.read_text().strip()
    raw = asyncio.run(_make_key(stack))
    partial = path.with_name(f"{CLI_KEY_FILE}.{os.getpid()}.tmp")
    partial.touch(mode=0o600)
    partial.write_text(raw)
    partial.replace(path)
    return raw
