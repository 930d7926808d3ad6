"""How each stream fact changes the ledger's aggregates: one group's fold, by tables of rules from contract events to
aggregate commands (those about a known batch: `batch_rules`)."""

import logging
from typing import Protocol, TypeVar
from uuid import UUID

from contracts.events.account import CreditsGranted, CreditsReleased, CreditsReserved
from contracts.events.batch import BatchCreated, BatchProgressed, ValidationProgressed
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
from services.ledger.batch_rules import _batch_facts, at_seconds
from services.ledger.decoding import ProgressFact
from services.ledger.domainmodel import Batch
from services.ledger.faults import blamed_on
from services.ledger.folded import Folded, aggregate_id
from services.ledger.membership import KeyOwner, Organization
from services.ledger.progress import Progress, ProgressRuns
from services.runtime.nats.foldrules import FoldRules

log = logging.getLogger(__name__)

A = TypeVar("A", bound=Folded)
_UNFOLDED: set[str] = set()
"""Batch fact types met with no rule (a newer fact than this ledger knows): warned of once each."""
NOT_FOLDED: tuple[type[Event], ...] = (ValidationProgressed,)
"""Batch facts that change nothing the ledger keeps, by design: the validator's reading progress (the batch's SSE
stream shows it straight from the log). Skipped quietly, before their batch is loaded."""
_facts = FoldRules[Folded | None]()
"""Rules for facts that create an aggregate, change one other than a batch, or are progress (merged in runs)."""


class Lookup(Protocol):
    """The ledger's aggregate by id: the group's own (`touched`), else cached or stored; None when there is none."""

    def __call__(self, cls: type[A], ident: UUID, touched: dict[UUID, Folded]) -> A | None: ...


class FoldingRules:
    """The rules folding one group of facts, in stream order, and what the group has come to so far: the aggregates
    it touched (saved together at its end), its batches by public id as progress facts named them, and their runs of
    progress not applied yet."""

    def __init__(self, lookup: Lookup, merge: bool = True) -> None:
        self._lookup = lookup
        self._merge = merge
        """Whether a batch's progress facts merge into runs (False: each is applied alone, as it comes)."""
        self.touched: dict[UUID, Folded] = {}
        self._named: dict[str, Batch] = {}
        self._runs = ProgressRuns()

    def get(self, cls: type[A], ident: UUID) -> A | None:
        return self._lookup(cls, ident, self.touched)

    def apply(self, seq: int, fact: Event | ProgressFact) -> None:
        """Fold one fact by its rule; the aggregate it changed (or refused with an anomaly) joins `touched`."""
        rule = _facts.rule_for(BatchProgressed if type(fact) is ProgressFact else type(fact))
        if rule is not None:
            aggregate = rule(self, seq, fact)
        elif isinstance(fact, Event) and fact.kind == "batch" and not isinstance(fact, NOT_FOLDED):
            aggregate = self._batch_fact(seq, fact)
        else:
            log.debug("sequence %d: %s is not the ledger's concern", seq, fact.type)
            return
        if aggregate is not None:
            self.touched[aggregate.id] = aggregate

    def flush(self, ident: UUID | None = None) -> None:
        """Apply a batch's pending progress (due before its next other fact); without `ident`, every batch's."""
        for progress in self._runs.take(ident):
            with blamed_on(progress.sequence, in_run=self._merge):  # of a merged run: its last fact's, for now
                self._advance(progress)

    def _batch_fact(self, seq: int, fact: Event) -> Batch | None:
        batch = self._existing(Batch, "batch", seq, fact)
        if batch is None:
            return None
        self.flush(batch.id)
        batch_rule = _batch_facts.rule_for(type(fact))
        if batch_rule is None:
            if fact.type not in _UNFOLDED:  # e.g. a newer informational fact: said once, not per event
                _UNFOLDED.add(fact.type)
                log.warning("sequence %d: no folding rule for %s; such facts leave the batch as it is", seq, fact.type)
            return None
        batch_rule(self, batch, seq, fact)
        if batch.status in TERMINAL:
            self._settle(batch, seq, fact)
        return batch

    def _advance(self, progress: Progress) -> None:
        """Apply progress, and credit the lines it made durable to the executor that ran the attempt."""
        batch = progress.batch
        before = batch.completed + batch.failed
        batch.progress(progress.sequence, progress.attempt, progress.completed, progress.failed, progress.shard,
                       progress.usage, progress.chunks)
        served = batch.completed + batch.failed - before  # zero for a fact applied before: credited once
        executor_id = batch.executor_of(progress.attempt)
        if served > 0 and executor_id is not None:
            executor = self.get(Executor, aggregate_id("executor", executor_id))
            if executor is not None:
                executor.serve(served)
                self.touched[executor.id] = executor

    def _result_file_refusal(self, fact: FileStored) -> str | None:
        """A batch's output or error file belongs to the batch's owner and lies under its own key, whatever a fact
        says (the fact desk refuses such facts before they are stored; this holds for any that got in)."""
        if fact.batch_id is None:
            return None  # an upload, or a result file of a log written before files named their batch
        batch = self.get(Batch, aggregate_id("batch", fact.batch_id))
        if batch is None:
            return f"it names batch {fact.batch_id}, which the ledger does not know"
        if fact.aggregate_id not in (output_file_id(fact.batch_id), error_file_id(fact.batch_id)):
            return f"it is not the output or error file of {fact.batch_id}"
        if fact.owner_key_id != batch.owner_key_id or fact.object_key != input_object_key(fact.aggregate_id):
            return f"its owner or object is not that of {fact.batch_id}'s result files"
        return None

    def _account(self, account_id: str) -> Account:
        account = self.get(Account, aggregate_id("account", account_id))
        if account is None:  # opened before the fact that names it first, which it then folds
            account = Account(account_id=account_id, sequence=0)
        self.touched[account.id] = account
        return account

    def _billing(self, batch: Batch) -> Account | None:
        """The account that bills the batch; None when none does (or it was folded before billing)."""
        account_id: str | None = getattr(batch, "billing_account", None)
        account = None if account_id is None else self.get(Account, aggregate_id("account", account_id))
        return account if account is not None and batch.batch_id in account.open else None

    def _debit(self, batch: Batch, seq: int, fact: ProgressFact) -> None:
        """A billed batch's result chunk committed: its usage is debited from the batch's account."""
        account = self._billing(batch)
        if account is not None and fact.usage is not None:
            account.debit(seq, batch.batch_id, fact.chunk_key, fact.usage, fact.occurred_at // 1000)
            self.touched[account.id] = account

    def _settle(self, batch: Batch, seq: int, fact: Event) -> None:
        """A billed batch ended: its account charges the rest of its usage (or the minimum), refunds the rest."""
        account = self._billing(batch)
        if account is None:
            return
        final = batch.usage or {}
        tokens = (final.get("input_tokens"), (final.get("input_tokens_details") or {}).get("cached_tokens"),
                  final.get("output_tokens"))
        account.settle(seq, batch.batch_id, ran=batch.completed > 0 or any(tokens), at=at_seconds(fact))
        self.touched[account.id] = account

    @_facts.on(BatchProgressed)
    def progressed(self, seq: int, fact: ProgressFact) -> Folded | None:
        """Merged into the batch's run of progress (applied before its next other fact, or at the group's end),
        unless the batch refuses it (an anomaly, or a fact folded before): then applied now, after that run. The
        batch joins `touched` when the group first names it."""
        batch = self._named.get(fact.aggregate_id)
        if batch is None:
            batch = self._existing(Batch, "batch", seq, fact)
            if batch is None:
                return None
            self._named[fact.aggregate_id] = self.touched[batch.id] = batch
        if fact.usage is not None:
            self._debit(batch, seq, fact)
        if batch.may_progress(seq):
            self._runs.add(batch, seq, fact)
            if not self._merge:
                self.flush(batch.id)
        else:
            self.flush(batch.id)
            self._runs.add(batch, seq, fact)
            self.flush(batch.id)
        return None

    # Facts that create an aggregate, or change one other than a batch: each returns the aggregate it touched.

    @_facts.on(BatchCreated)
    def _batch_created(self, seq: int, fact: BatchCreated) -> Folded | None:
        return self._found_again(Batch, "batch", fact.aggregate_id, seq, fact) or Batch(
            batch_id=fact.aggregate_id, sequence=seq, owner_key_id=fact.terms.owner_key_id,
            input_file_id=fact.input_file_id, endpoint=fact.terms.endpoint, completion_window=fact.completion_window,
            metadata=fact.metadata, created_at=fact.terms.created_at, expires_at=fact.terms.expires_at, held=fact.hold,
            billing_account=fact.billing_account, placement=fact.placement)

    @_facts.on(CreditsGranted)
    def _credits_granted(self, seq: int, fact: CreditsGranted) -> Folded | None:
        account = self._account(fact.aggregate_id)
        account.grant(seq, fact.amount_micros, at_seconds(fact))
        account.saw_credit_fact(seq)
        return account

    @_facts.on(CreditsReserved)
    def _credits_reserved(self, seq: int, fact: CreditsReserved) -> Folded | None:
        account = self._account(fact.aggregate_id)
        batch = self.get(Batch, aggregate_id("batch", fact.batch_id))
        if batch is not None and batch.status in TERMINAL:
            account.note_anomaly(seq, "reserved", f"batch {fact.batch_id} has ended")
        else:
            account.reserve(seq, fact.batch_id, fact.amount_micros, fact.price, fact.model, fact.endpoint,
                            at_seconds(fact))
        account.saw_credit_fact(seq)
        return account

    @_facts.on(CreditsReleased)
    def _credits_released(self, seq: int, fact: CreditsReleased) -> Folded | None:
        account = self._account(fact.aggregate_id)
        if self.get(Batch, aggregate_id("batch", fact.batch_id)) is not None:
            account.note_anomaly(seq, "released", f"batch {fact.batch_id} exists: its end settles it")
        else:
            account.release(seq, fact.batch_id, at_seconds(fact))
        account.saw_credit_fact(seq)
        return account

    @_facts.on(FileStored)
    def _file_stored(self, seq: int, fact: FileStored) -> Folded | None:
        refusal = self._result_file_refusal(fact)
        if refusal is not None:
            log.warning("sequence %d: file.stored of %s refused: %s", seq, fact.aggregate_id, refusal)
            return None
        return self._found_again(File, "file", fact.aggregate_id, seq, fact) or File(
            file_id=fact.aggregate_id, sequence=seq, owner_key_id=fact.owner_key_id, filename=fact.filename,
            purpose=fact.purpose, size=fact.bytes, sha256=fact.sha256, object_key=fact.object_key,
            created_at=fact.created_at, expires_at=fact.expires_at, model=fact.model,
            demand=None if fact.demand is None else fact.demand.model_dump())

    @_facts.on(FileDeleted)
    def _file_deleted(self, seq: int, fact: FileDeleted) -> Folded | None:
        file = self._existing(File, "file", seq, fact)
        if file is not None:
            file.delete(seq)
        return file

    @_facts.on(KeyCreated)
    def _key_created(self, seq: int, fact: KeyCreated) -> Folded | None:
        self._note_key_owner(seq, fact)
        return self._found_again(ApiKey, "apikey", fact.key_sha256, seq, fact) or ApiKey(
            key_sha256=fact.key_sha256, sequence=seq, role=fact.role, label=fact.label, user_id=fact.user_id,
            created_at=at_seconds(fact), provider_id=fact.provider_id, key_id=fact.public_id)

    @_facts.on(KeyRevoked)
    def _key_revoked(self, seq: int, fact: KeyRevoked) -> Folded | None:
        key = self.get(ApiKey, aggregate_id("apikey", fact.key_sha256))
        if key is None:
            log.warning("sequence %d: %s for an unknown key, skipped", seq, fact.type)
        else:
            key.revoke(seq)
        return key

    @_facts.on(UserCreated)
    def _user_created(self, seq: int, fact: UserCreated) -> Folded | None:
        return self._found_again(User, "user", fact.aggregate_id, seq, fact) or User(
            user_id=fact.aggregate_id, sequence=seq, display_name=fact.display_name,
            allowed_models=fact.allowed_models, created_at=at_seconds(fact), organization_id=fact.organization_id,
            role=fact.role)

    @_facts.on(OrganizationCreated)
    def _organization_created(self, seq: int, fact: OrganizationCreated) -> Folded | None:
        return self._found_again(Organization, "organization", fact.aggregate_id, seq, fact) or Organization(
            organization_id=fact.aggregate_id, sequence=seq, display_name=fact.display_name,
            created_at=at_seconds(fact))

    @_facts.on(ProviderRegistered)
    def _provider_registered(self, seq: int, fact: ProviderRegistered) -> Folded | None:
        return self._found_again(Provider, "provider", fact.aggregate_id, seq, fact) or Provider(
            provider_id=fact.aggregate_id, sequence=seq, display_name=fact.display_name,
            owner_key_id=fact.owner_key_id, owner_user_id=fact.owner_user_id, created_at=at_seconds(fact))

    @_facts.on(ProviderApproved, ProviderApprovalWithdrawn)
    def _provider_approval(self, seq: int, fact: ProviderApproved | ProviderApprovalWithdrawn) -> Folded | None:
        provider = self._existing(Provider, "provider", seq, fact)
        if provider is not None:
            provider.approve(seq, fact.organization_id, isinstance(fact, ProviderApproved))
        return provider

    @_facts.on(ExecutorRegistered)
    def _executor_registered(self, seq: int, fact: ExecutorRegistered) -> Folded | None:
        advert = fact.advert
        found = self.get(Executor, aggregate_id("executor", fact.aggregate_id))
        if found is None:
            return Executor(executor_id=fact.aggregate_id, sequence=seq, engine=advert.engine,
                            engine_version=advert.engine_version, models=advert.models, started_at=fact.started_at,
                            worker_key_id=fact.worker_key_id, provider_id=fact.provider_id)
        found.register_again(seq, advert.engine, advert.engine_version, advert.models, fact.started_at,
                             fact.worker_key_id, fact.provider_id)
        return found

    @_facts.on(ExecutorLost)
    def _executor_lost(self, seq: int, fact: ExecutorLost) -> Folded | None:
        executor = self._existing(Executor, "executor", seq, fact)
        if executor is not None:
            executor.lose(seq, fact.last_heartbeat_at)
        return executor

    def _found_again(self, cls: type[A], kind: str, ident: str, seq: int, fact: Event) -> A | None:
        """The aggregate a creating fact names, when it exists already (an anomaly unless a redelivery)."""
        self.flush(aggregate_id(kind, ident))
        existing = self.get(cls, aggregate_id(kind, ident))
        if existing is not None:
            existing.note_anomaly(seq, fact.name, f"{fact.type} for an existing {kind}")
        return existing

    def _note_key_owner(self, seq: int, fact: KeyCreated) -> None:
        """Remember the user of a key by the key's public id, the name other facts give it."""
        if fact.user_id is None:
            return
        key_id = fact.public_id
        if self.get(KeyOwner, aggregate_id("keyowner", key_id)) is None:  # a repeat is the key's anomaly
            owner = KeyOwner(key_id=key_id, sequence=seq, user_id=fact.user_id)
            self.touched[owner.id] = owner

    def _existing(self, cls: type[A], kind: str, seq: int, fact: Event | ProgressFact) -> A | None:
        found = self.get(cls, aggregate_id(kind, fact.aggregate_id))
        if found is None:
            log.warning("sequence %d: %s for unknown %s %s, skipped", seq, fact.type, kind, fact.aggregate_id)
        return found


def folded_types() -> tuple[type[Event], ...]:
    """The event types the fold has a rule for: every fact the ledger consumes."""
    return (*_facts.types(), *_batch_facts.types())
