"""The envelope every event carries, and the deterministic id that dedups its publish."""

import time
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from contracts.subjects import AggregateKind, event_subject


def now_ms() -> int:
    return int(time.time() * 1000)


class Event(BaseModel):
    """Base of all events. `event_id` is the `Nats-Msg-Id`: the same fact always gets the same id, and facts of
    different kinds never share one (a user and an organisation both named `acme` are two facts, not one deduplicated
    away)."""

    model_config = ConfigDict(frozen=True)

    kind: ClassVar[AggregateKind]
    name: ClassVar[str]
    dedup_fields: ClassVar[tuple[str, ...]] = ()
    """Payload fields that, with the kind, aggregate id and name, make one occurrence of this fact unique."""
    correlated_by: ClassVar[str | None] = None
    """The field naming the batch this fact belongs to, its `correlation_id` unless one is given."""

    event_id: str = ""
    type: str
    version: int = 1
    occurred_at: int = Field(default_factory=now_ms)
    """Milliseconds since the epoch."""
    aggregate_id: str
    correlation_id: str | None = None
    """The request or batch this fact belongs to, end to end: by default the batch `correlated_by` names."""
    causation_id: str | None = None
    """The event_id of the fact that caused this one."""

    @model_validator(mode="before")
    @classmethod
    def _fill_identity(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data.setdefault("type", f"{cls.kind}.{cls.name}")
            if cls.correlated_by is not None and "correlation_id" not in data:
                data["correlation_id"] = data.get(cls.correlated_by)
            if not data.get("event_id") and isinstance(data.get("aggregate_id"), str):
                # Without an aggregate id the fact is invalid: pydantic says so (a ValidationError every reader
                # skips), rather than a KeyError here that would wedge a reader on one malformed message.
                parts = [str(data.get(field, "")) for field in cls.dedup_fields]
                data["event_id"] = ":".join([cls.kind, data["aggregate_id"], cls.name, *parts])
        return data

    def with_derived_identity(self) -> Self:
        """This fact under the identity its content gives it (its `event_id`, its batch as correlation, no causation):
        how a fact from an untrusted party is stored, which must not choose the id the broker dedups by (an executor
        could otherwise take the id of a cancel or a revocation still to come, and have it dropped as a repeat)."""
        return type(self).model_validate(self.model_dump(exclude={"event_id", "correlation_id", "causation_id"}))

    @property
    def subject(self) -> str:
        return event_subject(self.kind, self.aggregate_id, self.name)
