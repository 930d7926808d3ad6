"""Scheduler settings (`SHESHNAG_SCHEDULER_*`)."""

from pydantic_settings import SettingsConfigDict

from services.runtime.settings import ServiceSettings
from services.scheduler.decisions import Policy


class SchedulerSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="SHESHNAG_SCHEDULER_", extra="ignore")

    tick_s: float = 1.0
    """How often decisions are taken (assignments, losses, cancels, expiries)."""
    leader_ttl_s: float = 10.0
    """A leader that stops renewing is replaced after this long."""
    shard_min_lines: int = 200
    """Split a batch across executors only into shards of at least this many lines."""
    max_queued_lines: int = 1_000_000
    """Lines one owner may have in validated or running batches; a batch past it fails with
    `enqueued_request_limit_exceeded`."""
    object_url_expiry_s: int = 900
    """How long a presigned object URL handed to an executor stays valid."""
    object_url_endpoint: str = ""
    """host:port the presigned URLs name, as executors reach the object store; empty: `SHESHNAG_S3_ENDPOINT`."""

    def policy(self) -> Policy:
        return Policy(shard_min_lines=self.shard_min_lines, max_queued_lines=self.max_queued_lines)
