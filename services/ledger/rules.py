"""How each stream fact changes the ledger's aggregates: the dispatch from contract events to aggregate commands."""

import logging
from typing import Any, NamedTuple, TypeVar
from uuid import UUID

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
from contracts.events.envelope import Event
from contracts.events.executor import ExecutorLost, ExecutorRegistered
from contracts.events.file import FileDeleted, FileStored
from contracts.events.key import KeyCreated, KeyRevoked, UserCreated
from contracts.events.organization import OrganizationCreated
from contracts.events.provider import ProviderApprovalWithdrawn, ProviderApproved, ProviderRegistered
from contracts.ids import error_file_id, output_file_id
from contracts.lifecycle import TERMINAL
from contracts.subjects import input_object_key
from services.ledger.accounts import Account
from services.ledger.aggregates import ApiKey, Executor, File, Provider, User
from services.ledger.decoding import ProgressFact
from services.ledger.domainmodel import Batch, Folded, aggregate_id
from services.ledger.membership import KeyOwner, Organization
from services.runtime.nats.foldrules import FoldRules

log = logging.getLogger(__name__)

A = TypeVar("A", bound=Folded)
Touched = dict[UUID, Folded]
"""The aggregates a group of facts changed so far, by id: saved together at the group's end."""
_UNFOLDED: set[str] = set()
"""Batch fact types met with no rule (a newer fact than this ledger knows): warned of once each."""
NOT_FOLDED: tuple[type[Event], ...] = (ValidationProgressed,)
"""Batch facts that change nothing the ledger keeps, by design: the validator's reading progress (the batch's SSE
stream shows it straight from the log). Skipped quietly, before their batch is loaded."""
_facts = FoldRules[Folded | None]()
"""Rules for facts that create an aggregate or change one other than a batch."""
_batch_facts = FoldRules[None]()
"""Rules for facts about a batch the ledger knows."""


class Progress(NamedTuple):
    """A batch's progress as one fact states it, or a run of them merged: the latest sequence and attempt, the
    highest counts, the tokens of the chunks not counted before and their keys."""

    batch: Batch
    sequence: int
    attempt: int
    completed: int
    failed: int
    shard: int
    usage: tuple[int, int, int] = (0, 0, 0)
    chunks: tuple[str, ...] = ()


class FoldingRules:
    """Mixed into the Ledger, which supplies `_get` (touched, cached or stored aggregates)."""

    _pending_progress: dict[UUID, dict[int, Progress]]
    """Per batch and shard, a run of progress facts not applied yet, merged into one."""
    _named: dict[str, Batch]
    """Batches by their public id as found so far in the group being folded (each is in `touched` too)."""

    def _get(self, cls: type[A], ident: UUID, touched: Touched) -> A | None:
        raise NotImplementedError

    def _defer_progress(self, batch: Batch, seq: int, fact: ProgressFact) -> None:
        # Progress facts dominate a busy stream; a run of them folds into one aggregate event with the same
        # result (counts are cumulative and never lowered), whatever the group boundaries were.
        # Counts are cumulative per shard, so only one shard's facts merge.
        ident = batch.id
        shards = self._pending_progress.get(ident)
        if shards is None:
            shards = self._pending_progress[ident] = {}
        attempt, completed, failed, shard = fact.attempt, fact.completed, fact.failed, fact.shard
        usage: tuple[int, int, int] = (0, 0, 0)
        chunks: tuple[str, ...] = ()
        earlier = shards.get(shard)
        if earlier is not None:  # (comparisons, not max(): this runs for nearly every fact)
            if earlier.completed > completed:
                completed = earlier.completed
            if earlier.failed > failed:
                failed = earlier.failed
            usage, chunks = earlier.usage, earlier.chunks
        tokens = fact.usage
        if tokens is not None and fact.chunk_key not in chunks and not batch.counted_chunk(fact.chunk_key):
            usage = (usage[0] + tokens[0], usage[1] + tokens[1], usage[2] + tokens[2])
            chunks = (*chunks, fact.chunk_key)
        shards[shard] = Progress(batch, seq, attempt, completed, failed, shard, usage, chunks)

    def _flush_progress(self, touched: Touched, ident: UUID | None = None) -> None:
        """Apply deferred progress: one batch's before its next other fact, or every batch's at a group's end."""
        if ident is None:
            due = [each for shards in self._pending_progress.values() for each in shards.values()]
            self._pending_progress.clear()
        else:
            due = list(self._pending_progress.pop(ident, {}).values())
        for progress in sorted(due, key=lambda pending: pending.sequence):
            self._progress(progress, touched)

    def _progress(self, progress: Progress, touched: Touched) -> None:
        """Apply progress, and credit the lines it made durable to the executor that ran the attempt."""
        batch = progress.batch
        before = batch.completed + batch.failed
        batch.progress(progress.sequence, progress.attempt, progress.completed, progress.failed, progress.shard,
                       progress.usage, progress.chunks)
        served = batch.completed + batch.failed - before  # zero for a fact applied before: credited once
        executor_id = batch.executor_of(progress.attempt)
        if served > 0 and executor_id is not None:
            executor = self._get(Executor, aggregate_id("executor", executor_id), touched)
            if executor is not None:
                executor.serve(served)
                touched[executor.id] = executor

    def _result_file_refusal(self, fact: FileStored, touched: Touched) -> str | None:
        """A batch's output or error file belongs to the batch's owner and lies under its own key, whatever a fact
        says (the fact desk refuses such facts before they are stored; this holds for any that got in)."""
        if fact.batch_id is None:
            return None  # an upload, or a result file of a log written before files named their batch
        batch = self._get(Batch, aggregate_id("batch", fact.batch_id), touched)
        if batch is None:
            return f"it names batch {fact.batch_id}, which the ledger does not know"
        if fact.aggregate_id not in (output_file_id(fact.batch_id), error_file_id(fact.batch_id)):
            return f"it is not the output or error file of {fact.batch_id}"
        if fact.owner_key_id != batch.owner_key_id or fact.object_key != input_object_key(fact.aggregate_id):
            return f"its owner or object is not that of {fact.batch_id}'s result files"
        return None

    def _apply(self, seq: int, fact: Event, touched: Touched) -> Folded | None:
        """Fold one fact; return the aggregate it changed (or refused with an anomaly), if any."""
        rule = _facts.rule_for(type(fact))
        if rule is not None:
            return rule(self, seq, fact, touched)
        if fact.kind != "batch" or isinstance(fact, NOT_FOLDED):
            log.debug("sequence %d: %s is not the ledger's concern", seq, fact.type)
            return None
        if isinstance(fact, BatchProgressed):
            self._apply_progress(seq, ProgressFact.of(fact), touched)
            return None
        batch = self._existing(Batch, "batch", seq, fact, touched)
        if batch is None:
            return None
        self._flush_progress(touched, batch.id)
        batch_rule = _batch_facts.rule_for(type(fact))
        if batch_rule is None:
            if fact.type not in _UNFOLDED:  # e.g. a newer informational fact: said once, not per event
                _UNFOLDED.add(fact.type)
                log.warning("sequence %d: no folding rule for %s; such facts leave the batch as it is", seq, fact.type)
            return None
        batch_rule(self, batch, seq, fact, touched)
        if getattr(batch, "billing_account", None) is not None and batch.status in TERMINAL:
            self._settle(batch, seq, fact, touched)
        return batch

    def _account(self, account_id: str, touched: Touched) -> Account:
        account = self._get(Account, aggregate_id("account", account_id), touched)
        if account is None:  # opened before the fact that names it first, which it then folds
            account = Account(account_id=account_id, sequence=0)
        touched[account.id] = account
        return account

    def _debit(self, batch: Batch, seq: int, fact: ProgressFact, touched: Touched) -> None:
        """A billed batch's result chunk committed: its usage is debited from the batch's account."""
        billing_account: str | None = getattr(batch, "billing_account", None)  # None on batches folded before
        if billing_account is None or fact.usage is None:
            return
        account = self._get(Account, aggregate_id("account", billing_account), touched)
        if account is not None and account.bills(batch.batch_id):
            input_tokens, cached, output = fact.usage
            account.debit(seq, batch.batch_id, fact.chunk_key, (input_tokens, cached, output), fact.occurred_at // 1000)
            touched[account.id] = account

    def _settle(self, batch: Batch, seq: int, fact: Event, touched: Touched) -> None:
        """A billed batch ended: its account charges the rest of its usage (or the minimum) and refunds the rest
        of its reservation."""
        account = self._get(Account, aggregate_id("account", batch.billing_account), touched)
        if account is None or not account.bills(batch.batch_id):
            return
        final = batch.usage
        usage = None if not final else (final.get("input_tokens", 0),
                                        (final.get("input_tokens_details") or {}).get("cached_tokens", 0),
                                        final.get("output_tokens", 0))
        account.settle(seq, batch.batch_id, ran=batch.completed > 0 or bool(usage and any(usage)), at=_at(fact))
        touched[account.id] = account

    def _apply_progress(self, seq: int, fact: ProgressFact, touched: Touched) -> None:
        """Fold a progress fact: merged into the batch's run of them, unless the batch refuses it (applied now).
        The batch joins `touched` when the group first names it."""
        batch = self._named.get(fact.aggregate_id)
        if batch is None:
            batch = self._existing(Batch, "batch", seq, fact, touched)
            if batch is None:
                return
            self._named[fact.aggregate_id] = touched[batch.id] = batch
        if fact.usage is not None:
            self._debit(batch, seq, fact, touched)
        if batch.may_progress(seq):
            self._defer_progress(batch, seq, fact)
        else:
            self._flush_progress(touched, batch.id)
            self._progressed(batch, seq, fact, touched)

    # Facts that create an aggregate, or change one other than a batch: each returns the aggregate it touched.

    @_facts.on(BatchCreated)
    def _batch_created(self, seq: int, fact: BatchCreated, touched: Touched) -> Folded | None:
        return self._found_again(Batch, "batch", fact.aggregate_id, seq, fact, touched) or Batch(
            batch_id=fact.aggregate_id, sequence=seq, owner_key_id=fact.owner_key_id,
            input_file_id=fact.input_file_id, endpoint=fact.endpoint, completion_window=fact.completion_window,
            metadata=fact.metadata, created_at=fact.created_at, expires_at=fact.expires_at, held=fact.hold,
            billing_account=fact.billing_account, placement=fact.placement)

    @_facts.on(CreditsGranted)
    def _credits_granted(self, seq: int, fact: CreditsGranted, touched: Touched) -> Folded | None:
        account = self._account(fact.aggregate_id, touched)
        account.grant(seq, fact.amount_micros, _at(fact))
        account.saw_credit_fact(seq)
        return account

    @_facts.on(CreditsReserved)
    def _credits_reserved(self, seq: int, fact: CreditsReserved, touched: Touched) -> Folded | None:
        account = self._account(fact.aggregate_id, touched)
        batch = self._get(Batch, aggregate_id("batch", fact.batch_id), touched)
        if batch is not None and batch.status in TERMINAL:
            account.note_anomaly(seq, "reserved", f"batch {fact.batch_id} has ended")
        else:
            account.reserve(seq, fact.batch_id, fact.amount_micros, fact.price, fact.model, fact.endpoint,
                            _at(fact))
        account.saw_credit_fact(seq)
        return account

    @_facts.on(CreditsReleased)
    def _credits_released(self, seq: int, fact: CreditsReleased, touched: Touched) -> Folded | None:
        account = self._account(fact.aggregate_id, touched)
        if self._get(Batch, aggregate_id("batch", fact.batch_id), touched) is not None:
            account.note_anomaly(seq, "released", f"batch {fact.batch_id} exists: its end settles it")
        else:
            account.release(seq, fact.batch_id, _at(fact))
        account.saw_credit_fact(seq)
        return account

    @_facts.on(FileStored)
    def _file_stored(self, seq: int, fact: FileStored, touched: Touched) -> Folded | None:
        refusal = self._result_file_refusal(fact, touched)
        if refusal is not None:
            log.warning("sequence %d: file.stored of %s refused: %s", seq, fact.aggregate_id, refusal)
            return None
        return self._found_again(File, "file", fact.aggregate_id, seq, fact, touched) or File(
            file_id=fact.aggregate_id, sequence=seq, owner_key_id=fact.owner_key_id, filename=fact.filename,
            purpose=fact.purpose, size=fact.bytes, sha256=fact.sha256, object_key=fact.object_key,
            created_at=fact.created_at, expires_at=fact.expires_at, model=fact.model,
            demand=None if fact.demand is None else fact.demand.model_dump())

    @_facts.on(FileDeleted)
    def _file_deleted(self, seq: int, fact: FileDeleted, touched: Touched) -> Folded | None:
        file = self._existing(File, "file", seq, fact, touched)
        if file is not None:
            file.delete(seq)
        return file

    @_facts.on(KeyCreated)
    def _key_created(self, seq: int, fact: KeyCreated, touched: Touched) -> Folded | None:
        self._note_key_owner(seq, fact, touched)
        return self._found_again(ApiKey, "apikey", fact.key_sha256, seq, fact, touched) or ApiKey(
            key_sha256=fact.key_sha256, sequence=seq, role=fact.role, label=fact.label, user_id=fact.user_id,
            created_at=_at(fact), provider_id=fact.provider_id, key_id=fact.public_id)

    @_facts.on(KeyRevoked)
    def _key_revoked(self, seq: int, fact: KeyRevoked, touched: Touched) -> Folded | None:
        key = self._get(ApiKey, aggregate_id("apikey", fact.key_sha256), touched)
        if key is None:
            log.warning("sequence %d: %s for an unknown key, skipped", seq, fact.type)
        else:
            key.revoke(seq)
        return key

    @_facts.on(UserCreated)
    def _user_created(self, seq: int, fact: UserCreated, touched: Touched) -> Folded | None:
        return self._found_again(User, "user", fact.aggregate_id, seq, fact, touched) or User(
            user_id=fact.aggregate_id, sequence=seq, display_name=fact.display_name,
            allowed_models=fact.allowed_models, created_at=_at(fact), organization_id=fact.organization_id,
            role=fact.role)

    @_facts.on(OrganizationCreated)
    def _organization_created(self, seq: int, fact: OrganizationCreated, touched: Touched) -> Folded | None:
        return self._found_again(Organization, "organization", fact.aggregate_id, seq, fact, touched) or \
            Organization(organization_id=fact.aggregate_id, sequence=seq, display_name=fact.display_name,
                         created_at=_at(fact))

    @_facts.on(ProviderRegistered)
    def _provider_registered(self, seq: int, fact: ProviderRegistered, touched: Touched) -> Folded | None:
        return self._found_again(Provider, "provider", fact.aggregate_id, seq, fact, touched) or Provider(
            provider_id=fact.aggregate_id, sequence=seq, display_name=fact.display_name,
            owner_key_id=fact.owner_key_id, owner_user_id=fact.owner_user_id, created_at=_at(fact))

    @_facts.on(ProviderApproved, ProviderApprovalWithdrawn)
    def _provider_approval(self, seq: int, fact: ProviderApproved | ProviderApprovalWithdrawn,
                           touched: Touched) -> Folded | None:
        provider = self._existing(Provider, "provider", seq, fact, touched)
        if provider is not None:
            provider.approve(seq, fact.organization_id, isinstance(fact, ProviderApproved))
        return provider

    @_facts.on(ExecutorRegistered)
    def _executor_registered(self, seq: int, fact: ExecutorRegistered, touched: Touched) -> Folded | None:
        advert = fact.advert
        found = self._get(Executor, aggregate_id("executor", fact.aggregate_id), touched)
        if found is None:
            return Executor(executor_id=fact.aggregate_id, sequence=seq, engine=advert.engine,
                            engine_version=advert.engine_version, models=advert.models, started_at=fact.started_at,
                            worker_key_id=fact.worker_key_id, provider_id=fact.provider_id)
        found.register_again(seq, advert.engine, advert.engine_version, advert.models, fact.started_at,
                             fact.worker_key_id, fact.provider_id)
        return found

    @_facts.on(ExecutorLost)
    def _executor_lost(self, seq: int, fact: ExecutorLost, touched: Touched) -> Folded | None:
        executor = self._existing(Executor, "executor", seq, fact, touched)
        if executor is not None:
            executor.lose(seq, fact.last_heartbeat_at)
        return executor

    # Facts about an existing batch, applied after its deferred progress; the batch keeps any anomaly itself.

    @_batch_facts.on(LineRejected)
    def _line_rejected(self, batch: Batch, seq: int, fact: LineRejected, touched: Touched) -> None:
        batch.reject_line(seq, fact.line, fact.code, fact.param, fact.message)

    @_batch_facts.on(BatchValidated)
    def _validated(self, batch: Batch, seq: int, fact: BatchValidated, touched: Touched) -> None:
        batch.validate(seq, _at(fact), fact.model, fact.total_lines, fact.error_count, fact.counts_by_code)

    @_batch_facts.on(BatchValidationFailed)
    def _validation_failed(self, batch: Batch, seq: int, fact: BatchValidationFailed, touched: Touched) -> None:
        batch.fail_validation(seq, _at(fact), fact.total_lines, fact.error_count, fact.counts_by_code,
                              fact.rejected_lines, fact.reason, fact.error_file_id)

    @_batch_facts.on(BatchAssigned)
    def _assigned(self, batch: Batch, seq: int, fact: BatchAssigned, touched: Touched) -> None:
        executor = self._get(Executor, aggregate_id("executor", fact.executor_id), touched)
        batch.assign(seq, fact.executor_id, fact.attempt, fact.shard,
                     getattr(executor, "provider_id", None) if executor is not None else None)

    @_batch_facts.on(ShardFinished)
    def _shard_finished(self, batch: Batch, seq: int, fact: ShardFinished, touched: Touched) -> None:
        batch.finish_shard(seq, fact.attempt, fact.shard, fact.stopped)

    @_batch_facts.on(BatchStarted)
    def _started(self, batch: Batch, seq: int, fact: BatchStarted, touched: Touched) -> None:
        batch.start(seq, _at(fact), fact.executor_id, fact.attempt, fact.engine, fact.engine_version)

    @_batch_facts.on(BatchProgressed)
    def _progressed(self, batch: Batch, seq: int, fact: ProgressFact, touched: Touched) -> None:
        # Only a fact the batch refuses (an anomaly, or one folded before): the rest are deferred. Called by
        # `_apply_progress` with the fact as decoding.py reads it.
        tokens = fact.usage if fact.usage is not None and not batch.counted_chunk(fact.chunk_key) else None
        usage = (tokens[0], tokens[1], tokens[2]) if tokens is not None else (0, 0, 0)
        self._progress(Progress(batch, seq, fact.attempt, fact.completed, fact.failed, fact.shard, usage,
                                (fact.chunk_key,) if tokens is not None else ()), touched)

    @_batch_facts.on(BatchFinalizing)
    def _finalizing(self, batch: Batch, seq: int, fact: BatchFinalizing, touched: Touched) -> None:
        batch.finalize(seq, _at(fact))

    @_batch_facts.on(BatchCompleted)
    def _completed(self, batch: Batch, seq: int, fact: BatchCompleted, touched: Touched) -> None:
        batch.complete(seq, _at(fact), fact.output_file_id, fact.error_file_id, fact.completed, fact.failed,
                       fact.usage.model_dump())

    @_batch_facts.on(BatchFailed)
    def _failed(self, batch: Batch, seq: int, fact: BatchFailed, touched: Touched) -> None:
        batch.fail(seq, _at(fact), fact.code, fact.reason, _ended_with_files(fact))

    @_batch_facts.on(BatchWaiting)
    def _waiting(self, batch: Batch, seq: int, fact: BatchWaiting, touched: Touched) -> None:
        batch.wait(seq, fact.reason)

    @_batch_facts.on(BatchReleased)
    def _released(self, batch: Batch, seq: int, fact: BatchReleased, touched: Touched) -> None:
        batch.release(seq)

    @_batch_facts.on(AttemptFailed)
    def _attempt_failed(self, batch: Batch, seq: int, fact: AttemptFailed, touched: Touched) -> None:
        batch.fail_attempt(seq, fact.attempt, fact.executor_id, fact.code, fact.reason)

    @_batch_facts.on(BatchCancelRequested)
    def _cancel_requested(self, batch: Batch, seq: int, fact: BatchCancelRequested, touched: Touched) -> None:
        if fact.code == "insufficient_credits":  # the batch says why it stopped, as an administrator's cancel does
            batch.request_cancel(seq, _at(fact), fact.requested_by_key_id, fact.code,
                                 "The organisation's balance ran out: lines not yet run end insufficient_credits.")
        else:
            batch.request_cancel(seq, _at(fact), fact.requested_by_key_id, fact.by_admin, fact.by_admin_message)

    @_batch_facts.on(BatchCancelled, BatchExpired)
    def _ended(self, batch: Batch, seq: int, fact: BatchCancelled | BatchExpired, touched: Touched) -> None:
        batch.end(seq, _at(fact), "cancelled" if isinstance(fact, BatchCancelled) else "expired",
                  fact.output_file_id, fact.error_file_id, fact.completed, fact.failed, fact.usage.model_dump())

    def _found_again(self, cls: type[A], kind: str, ident: str, seq: int, fact: Event,
                     touched: Touched) -> A | None:
        """The aggregate a creating fact names, when it exists already (an anomaly unless a redelivery)."""
        self._flush_progress(touched, aggregate_id(kind, ident))
        existing = self._get(cls, aggregate_id(kind, ident), touched)
        if existing is not None:
            existing.note_anomaly(seq, fact.name, f"{fact.type} for an existing {kind}")
        return existing

    def _note_key_owner(self, seq: int, fact: KeyCreated, touched: Touched) -> None:
        """Remember the user of a key by the key's public id, the name other facts give it."""
        if fact.user_id is None:
            return
        key_id = fact.public_id
        if self._get(KeyOwner, aggregate_id("keyowner", key_id), touched) is None:  # a repeat is the key's anomaly
            owner = KeyOwner(key_id=key_id, sequence=seq, user_id=fact.user_id)
            touched[owner.id] = owner

    def user_of_key(self, key_id: str) -> str | None:
        """The user a key acts for; None for a key without one. Called by the folding thread only."""
        owner = self._get(KeyOwner, aggregate_id("keyowner", key_id), {})
        return None if owner is None else owner.user_id

    def _existing(self, cls: type[A], kind: str, seq: int, fact: Event | ProgressFact,
                  touched: Touched) -> A | None:
        found = self._get(cls, aggregate_id(kind, fact.aggregate_id), touched)
        if found is None:
            log.warning("sequence %d: %s for unknown %s %s, skipped", seq, fact.type, kind, fact.aggregate_id)
        return found


def folded_types() -> tuple[type[Event], ...]:
    """The event types the fold has a rule for: every fact the ledger consumes."""
    return (*_facts.types(), *_batch_facts.types())


def _at(fact: Event) -> int:
    """When a fact happened, in the epoch seconds the aggregates keep."""
    return fact.occurred_at // 1000


def _ended_with_files(fact: BatchFailed) -> dict[str, Any] | None:
    """What a batch failed at run time still delivered (None: it failed before any file was written)."""
    if fact.completed is None or fact.failed is None:
        return None
    return {"output_file_id": fact.output_file_id, "error_file_id": fact.error_file_id, "completed": fact.completed,
            "failed": fact.failed, "usage": fact.usage.model_dump() if fact.usage is not None else None}
