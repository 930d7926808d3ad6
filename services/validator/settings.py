"""Validator settings (`SHESHNAG_VALIDATOR_*`)."""

from pydantic_settings import SettingsConfigDict

from services.runtime.settings import ServiceSettings


class ValidatorSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="SHESHNAG_VALIDATOR_", extra="ignore")

    max_lines: int = 50_000
    max_line_bytes: int = 1024 * 1024
    max_published_errors: int = 1000
    """Line errors published as events; the rest are only counted."""
