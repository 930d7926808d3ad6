"""Scheduler settings (`SHESHNAG_SCHEDULER_*`)."""

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.runtime.process.settings import ServiceSettings
from services.scheduler.decisions import Policy
from services.scheduler.fair_share import Weights


class SchedulerSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="SHESHNAG_SCHEDULER_", extra="ignore")

    tick_s: float = 1.0
    """How often decisions are taken (assignments, losses, cancels, expiries)."""
    leader_ttl_s: float = 10.0
    """A leader that stops renewing is replaced after this long."""
    unit_min_lines: int = 32
    """A batch of at most this many lines runs as one unit; larger ones are cut into units of at least this many."""
    unit_max_lines: int = 1024
    """Units are at most this many lines: the grain of sharing the fleet and of spreading a batch over executors (a
    lost executor loses only its uncommitted chunk: a unit resumes after its committed ones). Each unit costs the
    control plane about as much as a small batch (its assignment, start, end and log reads), so smaller units cost
    more per line; larger ones hold an executor's attempt places longer (its engine slots are shared between owners
    whatever the units, and a newcomer takes a guest place)."""
    user_weights: dict[str, float] = Field(default_factory=dict)
    """Fair-share weight per owner (`user-<id>`, or `key-<id>` for a key without a user), JSON; default 1 each."""
    organization_weights: dict[str, float] = Field(default_factory=dict)
    """Fair-share weight per organisation id, JSON; default 1 each (a user without one is an organisation alone)."""
    max_queued_lines: int = 1_000_000
    """Lines one owner may have in validated or running batches; a batch past it fails with
    `enqueued_request_limit_exceeded`."""
    object_url_expiry_s: int = 900
    """How long a presigned object URL handed to an executor stays valid."""
    object_url_endpoint: str = ""
    """host:port the presigned URLs name, as executors reach the object store (`https://host:port` where they reach
    it over HTTPS while the services do not, as behind `sheshnag up --listen`); empty: `SHESHNAG_S3_ENDPOINT`."""

    def policy(self) -> Policy:
        return Policy(unit_min_lines=self.unit_min_lines, unit_max_lines=self.unit_max_lines,
                      max_queued_lines=self.max_queued_lines,
                      weights=Weights(users=self.user_weights, organizations=self.organization_weights))
