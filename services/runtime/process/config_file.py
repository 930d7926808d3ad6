"""The optional settings file: a TOML file named by `SHESHNAG_CONFIG_FILE` (`sheshnag up --config FILE`), one table
per settings class (`[connection]`, `[gateway]`, …), keys named as the fields. The environment wins over the file, the
file over the default. An unknown key, a missing or non-TOML file, and a secret are refused at start: every process of
a stack reads the file, so secrets stay in the environment (`sheshnag up` hands each process only its own).
"""

import os
import re
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

CONFIG_FILE_VARIABLE = "SHESHNAG_CONFIG_FILE"
PREFIX = "SHESHNAG_"
SECRET_NAME = re.compile(r"secret|password|seed|worker_key|access_key")
"""Settings that hold a credential. (A URL may carry one too — `nats://core:…@host`, a PostgreSQL URL: give such a
URL in the environment.)"""


class ConfigFileError(ValueError):
    """The settings file cannot be used as it is: the message says where and why."""


def section_of(settings_cls: type[BaseSettings]) -> str:
    """The table a settings class reads: its variables' prefix less `SHESHNAG_` (`connection` for the bare one)."""
    prefix = str(settings_cls.model_config.get("env_prefix", ""))
    return prefix.removeprefix(PREFIX).rstrip("_").lower() or "connection"


@cache
def _parse(path: str, changed: int) -> dict[str, Any]:
    """Read once per version of the file (`changed`: its mtime; each settings class asks for its table)."""
    try:
        with open(path, "rb") as file:
            return tomllib.load(file)
    except tomllib.TOMLDecodeError as error:
        raise ConfigFileError(f"{path} is not TOML: {error}") from error


def file_settings(settings_cls: type[BaseSettings]) -> dict[str, Any]:
    """The values the file gives `settings_cls` (none without a file, or without its table)."""
    named = os.environ.get(CONFIG_FILE_VARIABLE)
    if not named:
        return {}
    section = section_of(settings_cls)
    path = str(Path(named).expanduser())
    try:
        table = _parse(path, os.stat(path).st_mtime_ns).get(section, {})
    except FileNotFoundError as error:
        raise ConfigFileError(f"{CONFIG_FILE_VARIABLE} names {path}, which does not exist") from error
    if not isinstance(table, dict):
        raise ConfigFileError(f"[{section}] in {named} must be a table")
    fields = settings_cls.model_fields
    own = {name for name, field in fields.items()
           if not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseSettings))}
    unknown = sorted(set(table) - own)
    if unknown:
        raise ConfigFileError(f"[{section}] in {named} has no setting {', '.join(unknown)} (known: "
                              f"{', '.join(sorted(own))}); docs/settings.md lists them")
    secrets = sorted(name for name in table if SECRET_NAME.search(name) or fields[name].repr is False)
    if secrets:
        raise ConfigFileError(f"[{section}] in {named} sets {', '.join(secrets)}: credentials stay in the environment "
                              f"(SHESHNAG_… variables), never in the settings file")
    return dict(table)


class ConfigFileSource(PydanticBaseSettingsSource):
    """The file's table for one settings class, below the environment in priority."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # every value comes from __call__

    def __call__(self) -> dict[str, Any]:
        return file_settings(self.settings_cls)
