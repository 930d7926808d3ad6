"""Aggregates → the OpenAI-shaped records the gateway reads from the read model, each at the key it names; both
dispatched by table."""

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from pydantic import BaseModel

from contracts.api.batch import Batch as BatchObject
from contracts.api.file import FileObject
from contracts.events.registry import decode_event
from contracts.readmodel import (
    ANOMALY_KINDS,
    AccountRecord,
    AnomalyKind,
    AnomalyRecord,
    ApiKeyRecord,
    BatchRecord,
    ExecutorRecord,
    FileRecord,
    OrganizationRecord,
    ProviderRecord,
    UserRecord,
)
from contracts.subjects import ReadModelKind, read_model_key
from services.ledger.accounts import Account
from services.ledger.aggregates import ApiKey, Executor, File, Provider, User
from services.ledger.application import Ledger
from services.ledger.chain import Fact
from services.ledger.domainmodel import Batch
from services.ledger.faults import Quarantine
from services.ledger.folded import Folded
from services.ledger.membership import Organization


@dataclass(frozen=True)
class KeyProjection:
    key_sha256: str
    record: ApiKeyRecord


Projection = (BatchRecord | FileRecord | UserRecord | KeyProjection | ProviderRecord | ExecutorRecord | AnomalyRecord
              | OrganizationRecord | AccountRecord)
UserOfKey = Callable[[str], str | None]
"""A key's user by the key's public id (None: a key without one): what a key creates is its user's."""


def project(aggregate: Folded, user_of_key: UserOfKey) -> Projection | None:
    """The read-model record of an aggregate; None for an aggregate without one."""
    projector = _PROJECTORS.get(type(aggregate))
    return None if projector is None else projector(aggregate, user_of_key)


def records_of(aggregates: Iterable[Folded], user_of_key: UserOfKey) -> list[Projection]:
    """The read-model records of those aggregates that have one."""
    return [projection for projection in (project(a, user_of_key) for a in aggregates) if projection is not None]


def folded_records(ledger: Ledger, facts: list[Fact]) -> list[Projection]:
    """Fold facts into the ledger: the records of the aggregates they touched, and the anomalies they noted."""
    touched = ledger.fold_facts(facts)
    records = [*records_of(touched, ledger.user_of_key), *new_anomalies(touched, facts),
               *set_aside(ledger.quarantine, facts)]
    if facts and ledger.quarantine.reasons:
        ledger.quarantine.forget_through(facts[-1].sequence)  # folded: none of them is folded again
    return records


def set_aside(quarantine: Quarantine, facts: Sequence[Fact]) -> list[AnomalyRecord]:
    """The anomalies of the facts among `facts` that no rule could fold, named by the aggregate each names."""
    records = []
    for fact in facts:
        reason = quarantine.reasons.get(fact.sequence) if quarantine.reasons else None
        if reason is None:
            continue
        event = decode_event(fact.data)
        if event.kind in ANOMALY_KINDS:
            records.append(AnomalyRecord.model_validate({
                "sequence": fact.sequence, "aggregate_kind": event.kind, "aggregate_id": event.aggregate_id,
                "event_type": event.type, "reason": reason, "occurred_at": event.occurred_at // 1000}))
    return records


NAMED_BY_OTHERS = (OrganizationRecord, UserRecord, ProviderRecord, FileRecord)
"""Records that others name (a key its user, an executor its provider, a batch its output and error files)."""


def in_write_order(projections: Sequence[Projection]) -> list[list[Projection]]:
    """One fold's records as the read model must take them, each list after the one before it: those others name
    first, so no reader finds a batch whose output file it cannot open yet, or a key without its user."""
    named: list[Projection] = [each for each in projections if isinstance(each, NAMED_BY_OTHERS)]
    naming: list[Projection] = [each for each in projections if not isinstance(each, NAMED_BY_OTHERS)]
    return [records for records in (named, naming) if records]


def projection_key(projection: Projection) -> str:
    """Where the projection lives in the read model, as its record names it."""
    kind, ident = _KEYS[type(projection)]
    return read_model_key(kind, ident(projection))


def stored(projection: Projection) -> BaseModel:
    """What the read model keeps at the projection's key (a key's record, without the hash it lives under)."""
    return projection.record if isinstance(projection, KeyProjection) else projection


MOMENTS = ("in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at", "cancelling_at",
           "cancelled_at")
"""The batch's times the API shows (`validated_at` is the ledger's own)."""


def batch_record(batch: Batch, owner_user_id: str | None = None) -> BatchRecord:
    errors = None
    if batch.error_total:
        errors = {"data": batch.errors, "total": batch.error_total, "counts_by_code": batch.counts_by_code}
    times = batch.times
    # One validation of plain data, nested errors included: far cheaper than building each model in Python.
    obj = BatchObject.model_validate(
        {
            "id": batch.batch_id,
            "endpoint": batch.endpoint,
            "input_file_id": batch.input_file_id,
            "completion_window": batch.completion_window,
            "status": batch.status,
            "created_at": batch.created_at,
            "expires_at": batch.expires_at,
            "errors": errors,
            "output_file_id": batch.output_file_id,
            "error_file_id": batch.error_file_id,
            **{moment: times.get(moment) for moment in MOMENTS},
            "request_counts": {"total": batch.total, "completed": batch.completed, "failed": batch.failed},
            "metadata": batch.metadata,
            "model": batch.model,
            "usage": batch.usage or running_usage(batch),
            "held": getattr(batch, "held", False) or None,
            "status_reason": held_reason(batch) or batch.status_reason,
            "placement": getattr(batch, "placement", "approved_providers"),
            "attempts": attempts(batch) or None,
        }
    )
    return BatchRecord(owner_key_id=batch.owner_key_id, owner_user_id=owner_user_id, batch=obj,
                       last_sequence=batch.last_sequence)


def attempts(batch: Batch) -> list[dict[str, Any]]:
    """Every attempt assigned, in order, with its executor and that executor's provider when assigned."""
    executors: dict[str, str] = getattr(batch, "attempt_executors", {})
    providers: dict[str, str] = getattr(batch, "attempt_providers", {})
    return [{"attempt": int(attempt), "executor_id": executor_id, "provider_id": providers.get(attempt)}
            for attempt, executor_id in sorted(executors.items(), key=lambda item: int(item[0]))]


def running_usage(batch: Batch) -> dict[str, Any] | None:
    """The tokens of the batch's committed chunks while it runs (its end states the final usage)."""
    tokens = getattr(batch, "running_usage", None)
    if not tokens:
        return None
    input_tokens, cached, output = tokens
    return {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output}


def held_reason(batch: Batch) -> str | None:
    if getattr(batch, "held", False) and batch.status == "validated":
        return f"Validated and held: POST /v1/batches/{batch.batch_id}/release to run it."
    return None


def file_record(file: File, owner_user_id: str | None = None) -> FileRecord:
    obj = FileObject.model_validate(
        {
            "id": file.file_id,
            "bytes": file.size,
            "created_at": file.created_at,
            "filename": file.filename,
            "purpose": file.purpose,
            "status": "processed",
            # Files folded before expiry existed have no such attribute.
            "expires_at": getattr(file, "expires_at", None),
        }
    )
    # Files folded before uploads named a model have no such attribute.
    return FileRecord(owner_key_id=file.owner_key_id, owner_user_id=owner_user_id, object_key=file.object_key,
                      sha256=file.sha256, deleted=file.deleted, model=getattr(file, "model", None),
                      demand=getattr(file, "demand", None), file=obj)


def api_key_record(key: ApiKey) -> ApiKeyRecord:
    return ApiKeyRecord.model_validate(
        {"key_id": key.key_id, "role": key.role, "label": key.label, "user_id": key.user_id,
         "provider_id": key.provider_id, "revoked": key.revoked, "created_at": key.created_at or None}
    )


def user_record(user: User) -> UserRecord:
    return UserRecord.model_validate(user, from_attributes=True)  # state from before `role` reads as its default


def executor_record(executor: Executor) -> ExecutorRecord:
    return ExecutorRecord.model_validate(executor, from_attributes=True)


def account_record(account: Account) -> AccountRecord:
    return AccountRecord.model_validate(
        {"account_id": account.account_id, "balance_micros": account.balance_micros,
         "reserved_micros": account.reserved_micros, "granted_micros": account.granted_micros,
         "debited_micros": account.debited_micros, "open_batches": len(account.open),
         "open_batch_ids": sorted(account.open),
         "last_event": account.last_event, "credit_sequence": account.credit_sequence,
         "last_sequence": account.last_sequence}
    )


def new_anomalies(touched: Iterable[Folded], facts: Sequence[Fact]) -> list[AnomalyRecord]:
    """The anomalies that folding `facts` noted, timed by the refused fact (so a replay writes the same)."""
    sequences = {fact.sequence: fact for fact in facts}
    records = []
    for aggregate in touched:
        for anomaly in aggregate.anomalies:
            fact = sequences.get(anomaly["sequence"])
            if fact is None:
                continue
            kind, ident = _PUBLIC_NAMES[type(aggregate)]  # how operators name it: a key by its id, never its hash
            records.append(AnomalyRecord(sequence=fact.sequence, aggregate_kind=kind, aggregate_id=ident(aggregate),
                                         event_type=f"{kind}.{anomaly['fact']}", reason=anomaly["reason"],
                                         occurred_at=decode_event(fact.data).occurred_at // 1000))
    return records


_PROJECTORS: dict[type[Folded], Callable[[Any, UserOfKey], Projection]] = {
    Batch: lambda batch, user_of_key: batch_record(batch, user_of_key(batch.owner_key_id)),
    File: lambda file, user_of_key: file_record(file, user_of_key(file.owner_key_id)),
    Organization: lambda organization, _: OrganizationRecord.model_validate(organization, from_attributes=True),
    ApiKey: lambda key, _: KeyProjection(key.key_sha256, api_key_record(key)),
    User: lambda user, _: user_record(user),
    Provider: lambda provider, _: ProviderRecord.model_validate(provider, from_attributes=True),
    Executor: lambda executor, _: executor_record(executor),
    Account: lambda account, _: account_record(account),
}
"""Aggregate type → its record (a KeyOwner has none)."""
_KEYS: dict[type, tuple[ReadModelKind, Callable[[Any], str]]] = {
    BatchRecord: ("batch", attrgetter("batch.id")),
    FileRecord: ("file", attrgetter("file.id")),
    UserRecord: ("user", attrgetter("user_id")),
    OrganizationRecord: ("organization", attrgetter("organization_id")),
    ProviderRecord: ("provider", attrgetter("provider_id")),
    ExecutorRecord: ("executor", attrgetter("executor_id")),
    AccountRecord: ("account", attrgetter("account_id")),
    AnomalyRecord: ("anomaly", lambda anomaly: f"{anomaly.sequence}.{anomaly.aggregate_kind}"),
    KeyProjection: ("apikey", attrgetter("key_sha256")),
}
"""Record type → the kind of its read-model key and its id there."""
_PUBLIC_NAMES: dict[type[Folded], tuple[AnomalyKind, Callable[[Any], str]]] = {
    Batch: ("batch", attrgetter("batch_id")),
    File: ("file", attrgetter("file_id")),
    ApiKey: ("key", attrgetter("key_id")),
    User: ("user", attrgetter("user_id")),
    Executor: ("executor", attrgetter("executor_id")),
    Provider: ("provider", attrgetter("provider_id")),
    Organization: ("organization", attrgetter("organization_id")),
    Account: ("account", attrgetter("account_id")),
}
