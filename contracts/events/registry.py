"""Decoding any event from the stream by its `type`."""

from typing import Annotated

from pydantic import Field, TypeAdapter

from contracts.events.batch import (
    BatchAssigned,
    BatchCompleted,
    BatchCreated,
    BatchFailed,
    BatchFinalizing,
    BatchProgressed,
    BatchStarted,
    BatchValidated,
    BatchValidationFailed,
    LineRejected,
)
from contracts.events.executor import ExecutorRegistered
from contracts.events.file import FileDeleted, FileStored
from contracts.events.key import KeyCreated

AnyEvent = Annotated[
    BatchCreated
    | LineRejected
    | BatchValidated
    | BatchValidationFailed
    | BatchAssigned
    | BatchStarted
    | BatchProgressed
    | BatchFinalizing
    | BatchCompleted
    | BatchFailed
    | FileStored
    | FileDeleted
    | KeyCreated
    | ExecutorRegistered,
    Field(discriminator="type"),
]

_adapter: TypeAdapter[AnyEvent] = TypeAdapter(AnyEvent)


def decode_event(data: bytes) -> AnyEvent:
    return _adapter.validate_json(data)


def encode_event(event: AnyEvent) -> bytes:
    return event.model_dump_json().encode()
