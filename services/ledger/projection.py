"""Aggregates → the OpenAI-shaped records the gateway reads from the read model."""

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from contracts.api.batch import Batch as BatchObject
from contracts.api.file import FileObject
from contracts.events.registry import decode_event
from contracts.readmodel import (
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
from contracts.subjects import read_model_key
from services.ledger.accounts import Account
from services.ledger.aggregates import ApiKey, Executor, File, Provider, User
from services.ledger.chain import Fact
from services.ledger.domainmodel import Batch, Folded
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
    if isinstance(aggregate, Batch):
        return batch_record(aggregate, user_of_key(aggregate.owner_key_id))
    if isinstance(aggregate, File):
        return file_record(aggregate, user_of_key(aggregate.owner_key_id))
    if isinstance(aggregate, Organization):
        return organization_record(aggregate)
    if isinstance(aggregate, ApiKey):
        return KeyProjection(aggregate.key_sha256, api_key_record(aggregate))
    if isinstance(aggregate, User):
        return user_record(aggregate)
    if isinstance(aggregate, Provider):
        return provider_record(aggregate)
    if isinstance(aggregate, Executor):
        return executor_record(aggregate)
    if isinstance(aggregate, Account):
        return account_record(aggregate)
    return None


def projection_key(projection: Projection) -> str:
    """Where the projection lives in the read model."""
    if isinstance(projection, BatchRecord):
        return read_model_key("batch", projection.batch.id)
    if isinstance(projection, FileRecord):
        return read_model_key("file", projection.file.id)
    if isinstance(projection, UserRecord):
        return read_model_key("user", projection.user_id)
    if isinstance(projection, OrganizationRecord):
        return read_model_key("organization", projection.organization_id)
    if isinstance(projection, ProviderRecord):
        return read_model_key("provider", projection.provider_id)
    if isinstance(projection, ExecutorRecord):
        return read_model_key("executor", projection.executor_id)
    if isinstance(projection, AccountRecord):
        return read_model_key("account", projection.account_id)
    if isinstance(projection, AnomalyRecord):
        return read_model_key("anomaly", f"{projection.sequence}.{projection.aggregate_kind}")
    return read_model_key("apikey", projection.key_sha256)


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
            "in_progress_at": times.get("in_progress_at"),
            "finalizing_at": times.get("finalizing_at"),
            "completed_at": times.get("completed_at"),
            "failed_at": times.get("failed_at"),
            "expired_at": times.get("expired_at"),
            "cancelling_at": times.get("cancelling_at"),
            "cancelled_at": times.get("cancelled_at"),
            "request_counts": {"total": batch.total, "completed": batch.completed, "failed": batch.failed},
            "metadata": batch.metadata,
            "model": batch.model,
            "usage": batch.usage or running_usage(batch),
            "held": getattr(batch, "held", False) or None,
            "status_reason": held_reason(batch) or batch.status_reason,
            "placement": getattr(batch, "placement", "approved_providers"),
            "attempts": batch.attempts() or None,
        }
    )
    return BatchRecord(owner_key_id=batch.owner_key_id, owner_user_id=owner_user_id, batch=obj,
                       last_sequence=batch.last_sequence)


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
    return FileRecord(
        owner_key_id=file.owner_key_id,
        owner_user_id=owner_user_id,
        object_key=file.object_key,
        sha256=file.sha256,
        deleted=file.deleted,
        # Files folded before uploads named a model have no such attribute.
        model=getattr(file, "model", None),
        demand=getattr(file, "demand", None),
        file=obj,
    )


def api_key_record(key: ApiKey) -> ApiKeyRecord:
    return ApiKeyRecord.model_validate(
        {"key_id": key.key_id, "role": key.role, "label": key.label, "user_id": key.user_id,
         "provider_id": key.provider_id, "revoked": key.revoked, "created_at": key.created_at or None}
    )


def user_record(user: User) -> UserRecord:
    return UserRecord(user_id=user.user_id, display_name=user.display_name, allowed_models=user.allowed_models,
                      created_at=user.created_at, organization_id=user.organization_id,
                      role=getattr(user, "role", "member"))


def organization_record(organization: Organization) -> OrganizationRecord:
    return OrganizationRecord(organization_id=organization.organization_id,
                              display_name=organization.display_name, created_at=organization.created_at)


def provider_record(provider: Provider) -> ProviderRecord:
    return ProviderRecord(provider_id=provider.provider_id, display_name=provider.display_name,
                          owner_key_id=provider.owner_key_id, owner_user_id=provider.owner_user_id,
                          created_at=provider.created_at,
                          approved_platform_wide=getattr(provider, "approved_platform_wide", False),
                          approved_organizations=list(getattr(provider, "approved_organizations", [])))


def executor_record(executor: Executor) -> ExecutorRecord:
    return ExecutorRecord.model_validate(
        {"executor_id": executor.executor_id, "engine": executor.engine, "engine_version": executor.engine_version,
         "models": executor.models, "worker_key_id": executor.worker_key_id, "status": executor.status,
         "started_at": executor.started_at, "last_heartbeat_at": executor.last_heartbeat_at,
         "lines_served": executor.lines_served}
    )


def account_record(account: Account) -> AccountRecord:
    return AccountRecord.model_validate(
        {"account_id": account.account_id, "balance_micros": account.balance_micros,
         "reserved_micros": account.reserved_micros, "granted_micros": account.granted_micros,
         "debited_micros": account.debited_micros, "open_batches": len(account.open),
         "open_batch_ids": sorted(account.open),
         "last_event": account.last_event, "credit_sequence": account.credit_sequence,
         "last_sequence": account.last_sequence}
    )


def aggregate_ref(aggregate: Folded) -> tuple[AnomalyKind, str]:
    """How operators name an aggregate: the kind of its facts and its public id (a key's id, never its hash)."""
    if isinstance(aggregate, Batch):
        return "batch", aggregate.batch_id
    if isinstance(aggregate, File):
        return "file", aggregate.file_id
    if isinstance(aggregate, ApiKey):
        return "key", aggregate.key_id
    if isinstance(aggregate, User):
        return "user", aggregate.user_id
    if isinstance(aggregate, Executor):
        return "executor", aggregate.executor_id
    if isinstance(aggregate, Provider):
        return "provider", aggregate.provider_id
    if isinstance(aggregate, Organization):
        return "organization", aggregate.organization_id
    if isinstance(aggregate, Account):
        return "account", aggregate.account_id
    raise TypeError(f"no public name for a {type(aggregate).__name__}")


def new_anomalies(touched: Iterable[Folded], facts: Sequence[Fact]) -> list[AnomalyRecord]:
    """The anomalies that folding `facts` noted, timed by the refused fact (so a replay writes the same)."""
    sequences = {fact.sequence: fact for fact in facts}
    records = []
    for aggregate in touched:
        for anomaly in aggregate.anomalies:
            fact = sequences.get(anomaly["sequence"])
            if fact is None:
                continue
            kind, ident = aggregate_ref(aggregate)
            records.append(AnomalyRecord(sequence=fact.sequence, aggregate_kind=kind, aggregate_id=ident,
                                         event_type=f"{kind}.{anomaly['fact']}", reason=anomaly["reason"],
                                         occurred_at=decode_event(fact.data).occurred_at // 1000))
    return records
