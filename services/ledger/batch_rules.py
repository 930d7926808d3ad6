"""How each fact about a batch the ledger knows changes it: one rule per fact, calling the batch's command (after the
batch's pending progress is applied); the batch keeps any anomaly itself."""

from typing import TYPE_CHECKING

from contracts.events.batch import (
    AttemptFailed,
    BatchAssigned,
    BatchCancelled,
    BatchCancelRequested,
    BatchCompleted,
    BatchExpired,
    BatchFailed,
    BatchFinalizing,
    BatchReleased,
    BatchStarted,
    BatchValidated,
    BatchValidationFailed,
    BatchWaiting,
    LineRejected,
    ShardFinished,
)
from contracts.events.envelope import Event
from services.ledger.aggregates import Executor
from services.ledger.domainmodel import Batch
from services.ledger.folded import aggregate_id
from services.runtime.nats.foldrules import FoldRules

if TYPE_CHECKING:
    from services.ledger.rules import FoldingRules

_batch_facts = FoldRules[None]()
"""Rules for facts about a batch the ledger knows."""


@_batch_facts.on(LineRejected)
def _line_rejected(fold: "FoldingRules", batch: Batch, seq: int, fact: LineRejected) -> None:
    batch.reject_line(seq, fact.line, fact.code, fact.param, fact.message)


@_batch_facts.on(BatchValidated)
def _validated(fold: "FoldingRules", batch: Batch, seq: int, fact: BatchValidated) -> None:
    batch.validate(seq, at_seconds(fact), fact.model, fact.total_lines, fact.error_count, fact.counts_by_code)


@_batch_facts.on(BatchValidationFailed)
def _validation_failed(fold: "FoldingRules", batch: Batch, seq: int, fact: BatchValidationFailed) -> None:
    batch.fail_validation(seq, at_seconds(fact), fact.total_lines, fact.error_count, fact.counts_by_code,
                          fact.rejected_lines, fact.reason, fact.error_file_id)


@_batch_facts.on(BatchAssigned)
def _assigned(fold: "FoldingRules", batch: Batch, seq: int, fact: BatchAssigned) -> None:
    executor = fold.get(Executor, aggregate_id("executor", fact.executor_id))
    batch.assign(seq, fact.executor_id, fact.attempt, fact.shard, getattr(executor, "provider_id", None))


@_batch_facts.on(ShardFinished)
def _shard_finished(fold: "FoldingRules", batch: Batch, seq: int, fact: ShardFinished) -> None:
    batch.finish_shard(seq, fact.attempt, fact.shard, fact.stopped)


@_batch_facts.on(BatchStarted)
def _started(fold: "FoldingRules", batch: Batch, seq: int, fact: BatchStarted) -> None:
    batch.start(seq, at_seconds(fact), fact.executor_id, fact.attempt, fact.engine, fact.engine_version)


@_batch_facts.on(BatchFinalizing)
def _finalizing(fold: "FoldingRules", batch: Batch, seq: int, fact: BatchFinalizing) -> None:
    batch.finalize(seq, at_seconds(fact))


@_batch_facts.on(BatchCompleted)
def _completed(fold: "FoldingRules", batch: Batch, seq: int, fact: BatchCompleted) -> None:
    batch.complete(seq, at_seconds(fact), fact.output_file_id, fact.error_file_id, fact.completed, fact.failed,
                   fact.usage.model_dump())


@_batch_facts.on(BatchFailed)
def _failed(fold: "FoldingRules", batch: Batch, seq: int, fact: BatchFailed) -> None:
    ended = None  # what a batch failed at run time still delivered (None: it failed before any file was written)
    if fact.completed is not None and fact.failed is not None:
        ended = {"output_file_id": fact.output_file_id, "error_file_id": fact.error_file_id,
                 "completed": fact.completed, "failed": fact.failed,
                 "usage": fact.usage.model_dump() if fact.usage is not None else None}
    batch.fail(seq, at_seconds(fact), fact.code, fact.reason, ended)


@_batch_facts.on(BatchWaiting)
def _waiting(fold: "FoldingRules", batch: Batch, seq: int, fact: BatchWaiting) -> None:
    batch.wait(seq, fact.reason)


@_batch_facts.on(BatchReleased)
def _released(fold: "FoldingRules", batch: Batch, seq: int, fact: BatchReleased) -> None:
    batch.release(seq)


@_batch_facts.on(AttemptFailed)
def _attempt_failed(fold: "FoldingRules", batch: Batch, seq: int, fact: AttemptFailed) -> None:
    batch.fail_attempt(seq, fact.attempt, fact.executor_id, fact.code, fact.reason)


@_batch_facts.on(BatchCancelRequested)
def _cancel_requested(fold: "FoldingRules", batch: Batch, seq: int, fact: BatchCancelRequested) -> None:
    if fact.code == "insufficient_credits":  # the batch says why it stopped, as an administrator's cancel does
        batch.request_cancel(seq, at_seconds(fact), fact.requested_by_key_id, fact.code,
                             "The organisation's balance ran out: lines not yet run end insufficient_credits.")
    else:
        batch.request_cancel(seq, at_seconds(fact), fact.requested_by_key_id, fact.by_admin, fact.by_admin_message)


@_batch_facts.on(BatchCancelled, BatchExpired)
def _ended(fold: "FoldingRules", batch: Batch, seq: int, fact: BatchCancelled | BatchExpired) -> None:
    batch.end(seq, at_seconds(fact), "cancelled" if isinstance(fact, BatchCancelled) else "expired",
              fact.output_file_id, fact.error_file_id, fact.completed, fact.failed, fact.usage.model_dump())


def at_seconds(fact: Event) -> int:
    """When a fact happened, in the epoch seconds the aggregates keep."""
    return fact.occurred_at // 1000
