"""Aggregates → the OpenAI-shaped records the gateway reads from the read model."""

from dataclasses import dataclass

from contracts.api.batch import Batch as BatchObject
from contracts.api.file import FileObject
from contracts.ids import key_id_for_hash
from contracts.readmodel import ApiKeyRecord, BatchRecord, FileRecord, UserRecord
from contracts.subjects import read_model_key
from services.ledger.aggregates import ApiKey, File, User
from services.ledger.domainmodel import Batch, Folded


@dataclass(frozen=True)
class KeyProjection:
    key_sha256: str
    record: ApiKeyRecord


Projection = BatchRecord | FileRecord | UserRecord | KeyProjection


def project(aggregate: Folded) -> Projection | None:
    """The read-model record of an aggregate; None for those only operators read (executors)."""
    if isinstance(aggregate, Batch):
        return batch_record(aggregate)
    if isinstance(aggregate, File):
        return file_record(aggregate)
    if isinstance(aggregate, ApiKey):
        return KeyProjection(aggregate.key_sha256, api_key_record(aggregate))
    if isinstance(aggregate, User):
        return user_record(aggregate)
    return None


def projection_key(projection: Projection) -> str:
    """Where the projection lives in the read model."""
    if isinstance(projection, BatchRecord):
        return read_model_key("batch", projection.batch.id)
    if isinstance(projection, FileRecord):
        return read_model_key("file", projection.file.id)
    if isinstance(projection, UserRecord):
        return read_model_key("user", projection.user_id)
    return read_model_key("apikey", projection.key_sha256)


def batch_record(batch: Batch) -> BatchRecord:
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
            "usage": batch.usage,
            "held": getattr(batch, "held", False) or None,
            "status_reason": held_reason(batch) or batch.status_reason,
        }
    )
    return BatchRecord(owner_key_id=batch.owner_key_id, batch=obj, last_sequence=batch.last_sequence)


def held_reason(batch: Batch) -> str | None:
    if getattr(batch, "held", False) and batch.status == "validated":
        return f"Validated and held: POST /v1/batches/{batch.batch_id}/release to run it."
    return None


def file_record(file: File) -> FileRecord:
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
        object_key=file.object_key,
        sha256=file.sha256,
        deleted=file.deleted,
        file=obj,
    )


def api_key_record(key: ApiKey) -> ApiKeyRecord:
    return ApiKeyRecord.model_validate(
        {"key_id": key_id_for_hash(key.key_sha256), "role": key.role, "label": key.label, "user_id": key.user_id,
         "revoked": key.revoked, "created_at": key.created_at or None}
    )


def user_record(user: User) -> UserRecord:
    return UserRecord(user_id=user.user_id, display_name=user.display_name, allowed_models=user.allowed_models,
                      created_at=user.created_at)
