"""The settings reference, generated from the pydantic-settings classes themselves: every environment variable each
service reads, its type, its default and what it does (the field's docstring). `docs/settings.md` is this module's
output (a test fails when they drift apart: `python -m infra.settings_reference > docs/settings.md` writes it
again), and each service subcommand's `--help` ends with its own part.
"""

import ast
import inspect
import itertools
import textwrap
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic_settings import BaseSettings

from services.executor.settings import ExecutorSettings
from services.gateway.settings import GatewaySettings
from services.ledger.settings import LedgerSettings
from services.runtime.process.config_file import section_of
from services.runtime.process.settings import ConnectionSettings
from services.scheduler.settings import SchedulerSettings
from services.validator.settings import ValidatorSettings

SERVICE_SETTINGS: dict[str, type[BaseSettings]] = {
    "gateway": GatewaySettings, "validator": ValidatorSettings, "scheduler": SchedulerSettings,
    "executor": ExecutorSettings, "ledger": LedgerSettings}
"""Each service's own settings; every service also reads `ConnectionSettings`."""
NESTED = frozenset({"connection"})
"""Fields that hold another settings class (read from its own variables), not a variable of their own."""


@dataclass(frozen=True)
class Setting:
    variable: str
    type: str
    default: str
    doc: str


def _docstrings(cls: type) -> dict[str, str]:
    """Each field's docstring: the string literal right after its annotated assignment (PEP 257's attribute
    docstrings), from this class and the classes it extends."""
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not (isinstance(klass, type) and issubclass(klass, BaseModel)) or klass.__module__.startswith("pydantic"):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for statement, following in itertools.pairwise(body):
            if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name) \
                    and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant) \
                    and isinstance(following.value.value, str):
                found[statement.target.id] = " ".join(following.value.value.split())
    return found


def _type_name(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if not getattr(annotation, "__args__", None) else None
    return text or str(annotation).replace("typing.", "").replace("pathlib.", "")


def settings_of(cls: type[BaseSettings]) -> list[Setting]:
    prefix = str(cls.model_config.get("env_prefix", ""))
    docs = _docstrings(cls)
    rows = []
    for name, field in cls.model_fields.items():
        if name in NESTED:
            continue
        if field.repr is False:
            default = "(secret)"
        elif field.default_factory is not None:
            default = "(computed)"
        else:
            default = "" if field.default is None else str(field.default)
        rows.append(Setting(f"{prefix}{name}".upper(), _type_name(field.annotation), default, docs.get(name, "")))
    return rows


def help_epilog(cls: type[BaseSettings]) -> str:
    """A service subcommand's `--help` tail: its variables, then the connection ones every service reads."""
    lines = ["settings (environment variables; see docs/settings.md):"]
    for part in (cls, ConnectionSettings):
        for setting in settings_of(part):
            default = f" (default {setting.default})" if setting.default else ""
            lines.append(f"  {setting.variable}{default}")
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def reference_markdown() -> str:
    out = ["# Settings reference", "",
           "Generated from the services' pydantic-settings classes by `python -m infra.settings_reference` (a test "
           "checks it is current). Every variable is read from the environment; `sheshnag up` sets the wiring ones "
           "(broker, object store, ports, paths) itself.", "",
           "## The settings file", "",
           "Besides the environment, settings may come from a TOML file named by `SHESHNAG_CONFIG_FILE` (`sheshnag "
           "up --config FILE` sets it for every process it starts): a table per section below (its name in "
           "brackets), keys named as the variable less its prefix, in lower case. An environment variable wins over "
           "the file, the file over the default. A key no setting has, a file that is missing or not TOML, and any "
           "credential (keys, passwords, seeds: they stay in the environment) are refused at start.", "",
           "```toml", "[connection]", 's3_bucket = "batches"', "[gateway]", "max_active_batches = 500",
           "[executor]", "n_threads = 8", "```", ""]
    sections: list[tuple[str, type[BaseSettings]]] = [("Every service: the connection", ConnectionSettings)]
    sections += [(f"`sheshnag {name}`", settings) for name, settings in SERVICE_SETTINGS.items()]
    for title, cls in sections:
        out += [f"## {title} · `[{section_of(cls)}]`", "", "| variable | type | default | what it does |",
                "|---|---|---|---|"]
        out += [f"| `{s.variable}` | {_cell(s.type)} | {_cell(s.default) or '—'} | {_cell(s.doc) or '—'} |"
                for s in settings_of(cls)]
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(reference_markdown(), end="")
