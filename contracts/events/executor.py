"""Facts about executors joining the fleet. Heartbeats are liveness, kept in a KV bucket, not here."""

from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, Field, model_validator

from contracts.events.envelope import Event
from contracts.permissions import EXECUTOR_ID_PATTERN

EngineName = Literal["llamacpp", "tensorrt_llm", "transformers", "simulated"]
"""`simulated` answers at once and computes nothing (bench/control_plane.py): only a catalogue entry naming it
uses it."""
MAX_ADVERTISED_MODELS = 256
MAX_DEVICES = 64
MAX_SLOTS = 4096
MAX_PARALLEL_ATTEMPTS = 256
MAX_PROTOCOL = 64
Bytes = Field(ge=0, le=1 << 60)
"""Memory sizes: an exabyte is far beyond any device; more is nonsense an executor made up."""
ModelId = Annotated[str, Field(min_length=1, max_length=256)]


class DeviceMemory(BaseModel):
    name: str = Field(max_length=256)
    total_bytes: int = Bytes
    free_bytes: int = Bytes

    @model_validator(mode="after")
    def _free_within_total(self) -> "DeviceMemory":
        if self.free_bytes > self.total_bytes:
            raise ValueError("free_bytes exceeds total_bytes")
        return self


class ExecutorAdvert(BaseModel):
    """What an executor can do right now; its heartbeat value in the executors bucket. Written by the executor, so
    untrusted: the bounds below refuse values no real executor states (a value outside them is skipped whole)."""

    executor_id: str = Field(pattern=f"^{EXECUTOR_ID_PATTERN}$")
    engine: EngineName
    engine_version: str = Field(max_length=64)
    models: list[ModelId] = Field(max_length=MAX_ADVERTISED_MODELS)
    """Catalogue ids it can serve."""
    loaded_models: list[ModelId] = Field(max_length=MAX_ADVERTISED_MODELS)
    devices: list[DeviceMemory] = Field(max_length=MAX_DEVICES)
    slots: int = Field(ge=0, le=MAX_SLOTS)
    heartbeat_at: int = Field(ge=0)
    """Milliseconds since the epoch."""
    parallel_attempts: int = Field(default=1, ge=1, le=MAX_PARALLEL_ATTEMPTS)
    """How many attempts (of any batches) it runs at once, through its one pool of engine slots; the scheduler
    assigns it no more than that (1: an executor from before it said), but for `GUEST_ATTEMPTS` more."""
    guest_attempts: int = Field(default=0, ge=0, le=MAX_PARALLEL_ATTEMPTS)
    """Attempts it takes beyond `parallel_attempts`, each of an owner with nothing running anywhere (a newcomer's
    small batch starts at the next free engine slot instead of after the units in hand); 0: an executor from
    before it said."""
    protocol: int = Field(default=1, ge=1, le=MAX_PROTOCOL)
    """The newest shape of commands it takes (`contracts.commands.BatchCommand.wire`); the scheduler sends each
    command in the newest shape both speak (1: an executor from before it said, which takes flat commands only)."""


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
