"""Decoding any event from the stream by its `type`."""

from typing import Annotated

from pydantic import Field, TypeAdapter

from contracts.events.account import CreditsGranted, CreditsReleased, CreditsReserved
from contracts.events.batch import (
    AttemptFailed,
    BatchAssigned,
    BatchCancelled,
    BatchCancelRequested,
    BatchCompleted,
    BatchCreated,
    BatchExpired,
    BatchFailed,
    BatchFinalizing,
    BatchProgressed,
    BatchReleased,
    BatchStarted,
    BatchValidated,
    BatchValidationFailed,
    BatchWaiting,
    LineRejected,
    ShardFinished,
    ValidationProgressed,
)
from contracts.events.executor import ExecutorLost, ExecutorRegistered
from contracts.events.file import FileDeleted, FileStored, FileUsed
from contracts.events.key import KeyCreated, KeyRevoked, UserCreated
from contracts.events.organization import OrganizationCreated
from contracts.events.provider import ProviderApprovalWithdrawn, ProviderApproved, ProviderRegistered

AnyEvent = Annotated[
    BatchCreated
    | LineRejected
    | ValidationProgressed
    | BatchValidated
    | BatchValidationFailed
    | BatchAssigned
    | BatchStarted
    | BatchProgressed
    | ShardFinished
    | BatchFinalizing
    | BatchCompleted
    | BatchFailed
    | BatchWaiting
    | AttemptFailed
    | BatchCancelRequested
    | BatchReleased
    | BatchCancelled
    | BatchExpired
    | FileStored
    | FileDeleted
    | FileUsed
    | KeyCreated
    | KeyRevoked
    | UserCreated
    | OrganizationCreated
    | ExecutorRegistered
    | ExecutorLost
    | ProviderRegistered
    | ProviderApproved
    | ProviderApprovalWithdrawn
    | CreditsGranted
    | CreditsReserved
    | CreditsReleased,
    Field(discriminator="type"),
]

_adapter: TypeAdapter[AnyEvent] = TypeAdapter(AnyEvent)


def decode_event(data: bytes) -> AnyEvent:
    return _adapter.validate_json(data)
