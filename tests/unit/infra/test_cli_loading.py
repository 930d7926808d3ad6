"""The `sheshnag` command loads only what the command given needs: its help, and a tool's arguments, come without
the services, the broker client or the HTTP stack (each call used to import them all, about a second)."""

import json
import subprocess
import sys

import pytest

from infra.cli import parse_args
from infra.service_names import SERVICES

HEAVY = ("aiohttp", "nats", "faststream", "minio", "pydantic", "services")
COMMANDS = ("up", "keys", "users", "organizations", "credits", "batch", "status", "nats-config", "certs", "models",
            "backup", "restore", *SERVICES)


def loaded_after(code: str) -> list[str]:
    """The heavy top-level packages a fresh interpreter holds after `code`."""
    shown = subprocess.run([sys.executable, "-c", f"import json, sys\n{code}\n"
                            f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r})))"],
                           capture_output=True, text=True, check=True, timeout=60)
    loaded: list[str] = json.loads(shown.stdout.strip().splitlines()[-1])
    return loaded


def test_the_help_lists_every_command_and_loads_none_of_them() -> None:
    shown = subprocess.run([sys.executable, "-m", "infra.cli", "--help"], capture_output=True, text=True, check=True,
                           timeout=60).stdout
    assert all(f"    {name}" in shown for name in COMMANDS), shown
    assert loaded_after("from infra.cli import parse_args\ntry:\n    parse_args(['--help'])\nexcept SystemExit:\n"
                        "    pass") == []


@pytest.mark.parametrize("argv", [["keys", "list"], ["users", "create", "alice"], ["credits", "show"],
                                  ["ledger", "audit", "batch_x"]])
def test_a_stack_tools_arguments_load_nothing_heavy(argv: list[str]) -> None:
    assert loaded_after(f"from infra.cli import parse_args\nparse_args({argv!r})") == []


def test_a_command_declared_by_its_own_module_gets_its_arguments_when_given() -> None:
    assert parse_args(["batch", "list"]).batch_command == "list"
    assert parse_args(["certs", "rotate"]).command == "certs"
    assert parse_args(["executor", "--deployment", "https://example.test", "--worker-key", "wk-x"]).deployment
