"""Scheduler settings (`SHESHNAG_SCHEDULER_*`)."""

from pydantic_settings import SettingsConfigDict

from services.runtime.settings import ServiceSettings


class SchedulerSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="SHESHNAG_SCHEDULER_", extra="ignore")

    retry_unassignable_s: float = 2.0
    """How soon a batch nobody can serve is looked at again."""
