"""Facts about executors joining the fleet. Heartbeats are liveness, kept in a KV bucket, not here."""

from typing import ClassVar, Literal

from pydantic import BaseModel

from contracts.events.envelope import Event

EngineName = Literal["llamacpp", "tensorrt_llm", "transformers"]


class DeviceMemory(BaseModel):
    name: str
    total_bytes: int
    free_bytes: int


class ExecutorAdvert(BaseModel):
    """What an executor can do right now; its heartbeat value in the executors bucket."""

    executor_id: str
    engine: EngineName
    engine_version: str
    models: list[str]
    """Catalogue ids it can serve."""
    loaded_models: list[str]
    devices: list[DeviceMemory]
    slots: int
    heartbeat_at: int
    """Milliseconds since the epoch."""
    parallel_attempts: int = 1
    """How many attempts (of any batches) it runs at once, through its one pool of engine slots; the scheduler
    assigns it no more than that (1: an executor from before it said), but for `GUEST_ATTEMPTS` more."""
    guest_attempts: int = 0
    """Attempts it takes beyond `parallel_attempts`, each of an owner with nothing running anywhere (a newcomer's
    small batch starts at the next free engine slot instead of after the units in hand); 0: an executor from
    before it said."""


GUEST_ATTEMPTS = 2
"""The guest places an executor advertises: enough for a couple of newcomers at once, few enough that the units in
hand are not starved of slots."""


class ExecutorRegistered(Event):
    kind: ClassVar = "executor"
    name: ClassVar = "registered"
    dedup_fields: ClassVar = ("started_at",)
    type: Literal["executor.registered"] = "executor.registered"
    advert: ExecutorAdvert
    started_at: int
    worker_key_id: str | None = None
    """The worker key it proved itself with; executors without one are never assigned work."""
    provider_id: str | None = None
    """The provider of that worker key (the owner of this executor id); None: an admin's or operator's worker key,
    or a registration from before providers were recorded here."""


class ExecutorLost(Event):
    """An executor missed its heartbeats; whatever it was running must be retried elsewhere."""

    kind: ClassVar = "executor"
    name: ClassVar = "lost"
    dedup_fields: ClassVar = ("last_heartbeat_at",)
    type: Literal["executor.lost"] = "executor.lost"
    last_heartbeat_at: int
    """Milliseconds since the epoch."""
