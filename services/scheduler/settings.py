"""Scheduler settings (`SHESHNAG_SCHEDULER_*`)."""

from pydantic_settings import SettingsConfigDict

from services.runtime.settings import ServiceSettings


class SchedulerSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="SHESHNAG_SCHEDULER_", extra="ignore")

    tick_s: float = 1.0
    """How often decisions are taken (assignments, losses, cancels, expiries)."""
    leader_ttl_s: float = 10.0
    """A leader that stops renewing is replaced after this long."""
