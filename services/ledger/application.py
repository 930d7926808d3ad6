"""The ledger application: folds groups of stream facts into aggregates, keeps the checkpoint, answers queries.
Synchronous like the eventsourcing library under it; callers on an event loop use `asyncio.to_thread`."""

from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

from eventsourcing.application import AggregateNotFoundError, Application
from eventsourcing.domain import Aggregate, Snapshot
from eventsourcing.persistence import ProcessRecorder, Tracking, Transcoder

from contracts.events.envelope import Event
from contracts.subjects import EVENTS_STREAM
from services.ledger.aggregates import CHAIN_ID, ApiKey, Executor, File, StreamChain, register_stable_topics
from services.ledger.chain import Fact, Link, contiguous_runs, link_run
from services.ledger.decoding import ProgressFact, decode_fact
from services.ledger.domainmodel import Batch
from services.ledger.faults import FoldFault, Quarantine, blamed
from services.ledger.folded import Folded, aggregate_id
from services.ledger.membership import KeyOwner
from services.ledger.rules import FoldingRules
from services.ledger.sqlite_store import FACTORY_TOPIC as SQLITE_FACTORY_TOPIC
from services.ledger.transcoding import LedgerTranscoder

A = TypeVar("A", bound=Folded)


ABSENT_KEPT = 100_000
"""Ids of missing aggregates remembered at most (then forgotten all at once, and learnt again)."""

MATERIALISED = f"{EVENTS_STREAM}:read_model"
"""Tracking name of the read-model checkpoint; the state's own checkpoint is tracked as EVENTS_STREAM."""


def persistence_env(db_path: Path | None) -> dict[str, str]:
    """SQLite when a file is named (synced at WAL checkpoints only: `sqlite_store`), else in memory (POPO)."""
    if db_path is None:
        return {"PERSISTENCE_MODULE": "eventsourcing.popo"}
    return {"PERSISTENCE_MODULE": SQLITE_FACTORY_TOPIC, "SQLITE_DBNAME": str(db_path)}


class Ledger(Application[UUID]):
    name = "ledger"
    is_snapshotting_enabled = True
    snapshot_every = 100
    """A batch with a million rejected lines still loads from a snapshot and at most this many events."""

    def __init__(self, env: dict[str, str] | None = None, cache_size: int = 10_000) -> None:
        register_stable_topics()
        super().__init__(env)
        self._cache: OrderedDict[UUID, Folded] = OrderedDict()
        """Aggregates as last saved. The ledger is its store's only writer, so they cannot go stale."""
        self._cache_size = cache_size
        self._absent: set[UUID] = set()
        """Ids the store has no aggregate for, as last looked up: facts naming one again cost no query.
        An id leaves once a fold creates its aggregate (until then, the group's `touched` holds it)."""
        self._chain: StreamChain | None = None
        self.quarantine = Quarantine()
        """Facts no rule could fold (each twice), set aside: see `services/ledger/faults.py`."""

    def construct_transcoder(self) -> Transcoder:
        transcoder = LedgerTranscoder()  # a tenant's dict is read back as the dict it was: see its module
        self.register_transcodings(transcoder)
        return transcoder

    def construct_recorder(self) -> ProcessRecorder:
        return self.factory.process_recorder()

    @property
    def tracking(self) -> ProcessRecorder:
        assert isinstance(self.recorder, ProcessRecorder)
        return self.recorder

    # Commands

    def fold(self, facts: Sequence[tuple[int, Event]]) -> list[Folded]:
        """Fold events as the bus would carry them (for tests and tools holding decoded events)."""
        return self.fold_facts([Fact(seq, event.subject, event.model_dump_json().encode()) for seq, event in facts])

    def fold_facts(self, facts: Sequence[Fact]) -> list[Folded]:
        """Apply facts in stream order; save state, hash chain and checkpoint in one transaction. Returns every
        aggregate touched, even by a fact at or below the checkpoint (a crash may have come before materialising).
        A fact whose rule raises twice from the stored state is set aside (`quarantine`), and the group folds
        without it."""
        while True:
            try:
                touched = self._fold_once(facts)
            except FoldFault as fault:
                self.quarantine.judge(fault)
                continue
            self.quarantine.folded()
            return touched

    def _fold_once(self, facts: Sequence[Fact]) -> list[Folded]:
        quarantine = self.quarantine
        fold = FoldingRules(self._get, merge=not quarantine.unmerged)
        try:
            chain = self._chain or self._load_chain()
            new = [fact for fact in facts if fact.sequence > chain.last_sequence]
            apply, progressed = fold.apply, fold.progressed
            sequence = 0
            try:
                for fact in facts:
                    sequence = fact.sequence
                    if quarantine.reasons and sequence in quarantine:
                        continue  # linked in the chain below, as every fact is; folded by no rule
                    decoded = decode_fact(fact)
                    if type(decoded) is ProgressFact:  # most facts of a busy stream: their rule, without the lookup
                        progressed(sequence, decoded)
                    elif decoded is not None:
                        apply(sequence, decoded)
            except Exception as error:
                fault = blamed(sequence, error)
                if fault is error:
                    raise
                raise fault from error
            fold.flush()
            head = chain.head
            for run in contiguous_runs(new):
                digests, head = link_run(head, run)
                chain.link(first_sequence=run[0].sequence, digests=digests, head=head)
            touched = fold.touched
            pending: list[Aggregate] = [*touched.values(), chain]
            tracking = Tracking(application_name=EVENTS_STREAM, notification_id=new[-1].sequence) if new else None
            recordings = self.events.put([e for a in pending for e in a.collect_events()], tracking=tracking)
        except BaseException:
            self._cache.clear()  # cached aggregates may hold changes that were never saved
            self._absent.clear()
            self._chain = None
            raise
        self._chain = chain
        self._absent.difference_update(touched)
        self._snapshot({r.domain_event.originator_id for r in recordings
                        if r.domain_event.originator_version % self.snapshot_every == 0}, touched)
        for ident, aggregate in touched.items():
            self._cache[ident] = aggregate
            self._cache.move_to_end(ident)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return list(touched.values())

    def _load_chain(self) -> StreamChain:
        try:
            found: Aggregate = self.repository.get(CHAIN_ID)
        except AggregateNotFoundError:
            return StreamChain()
        assert isinstance(found, StreamChain)
        return found

    def _snapshot(self, due: set[UUID], touched: dict[UUID, Folded]) -> None:
        # From the state in hand: the library's own snapshotting would refold the aggregate from the store.
        assert self.snapshots is not None
        snapshots: list[Snapshot] = [touched[ident].Snapshot.take(touched[ident]) for ident in due if ident in touched]
        if CHAIN_ID in due and self._chain is not None:
            snapshots.append(StreamChain.Snapshot.take(self._chain))
        if snapshots:  # an empty put is still a transaction (a commit per group, in SQLite)
            self.snapshots.put(snapshots)

    def record_checkpoint(self, sequence: int) -> None:
        """Every fact up to `sequence` is folded and materialised."""
        self.tracking.insert_tracking(Tracking(application_name=MATERIALISED, notification_id=sequence))

    # Queries

    def checkpoint(self) -> int:
        """Where a restart resumes: the last fact materialised (facts after it may be folded already)."""
        return self.tracking.max_tracking_id(MATERIALISED) or 0

    def folded_checkpoint(self) -> int:
        """The last fact whose effects are in the store, saved in the same transaction as them."""
        return self.tracking.max_tracking_id(EVENTS_STREAM) or 0

    def chain_links(self) -> list[Link]:
        """Every run of the hash chain the ledger checkpointed, in stream order."""
        return [Link(e.first_sequence, list(e.digests), e.head) for e in self.events.get(CHAIN_ID)
                if isinstance(e, StreamChain.Linked)]

    def chain_state(self) -> tuple[int, str]:
        """The hash chain as saved: the last sequence it covers and its head ("" before any fact)."""
        chain = self._load_chain()
        return chain.last_sequence, chain.head

    def chain_digest_at(self, sequence: int) -> str | None:
        """The short digest the chain checkpointed for the fact at `sequence`; None when no link here covers it
        (a sequence the stream never had, or one before this store was seeded from an archived point)."""
        page_size, lte = 8, None
        while True:
            page = list(self.events.get(CHAIN_ID, desc=True, limit=page_size, lte=lte))
            for found in page:
                if isinstance(found, StreamChain.Linked):
                    last = found.first_sequence + len(found.digests) - 1
                    if found.first_sequence <= sequence <= last:
                        return str(found.digests[sequence - found.first_sequence])
                    if last < sequence:
                        return None
            if len(page) < page_size:
                return None
            lte = page[-1].originator_version - 1

    def executor(self, executor_id: str) -> Executor | None:
        return self._load(Executor, aggregate_id("executor", executor_id))

    def batch(self, batch_id: str) -> Batch | None:
        return self._load(Batch, aggregate_id("batch", batch_id))

    def file(self, file_id: str) -> File | None:
        return self._load(File, aggregate_id("file", file_id))

    def api_key(self, key_sha256: str) -> ApiKey | None:
        return self._load(ApiKey, aggregate_id("apikey", key_sha256))

    def user_of_key(self, key_id: str) -> str | None:
        """The user a key acts for; None for a key without one. Called by the folding thread only."""
        owner = self._get(KeyOwner, aggregate_id("keyowner", key_id), {})
        return None if owner is None else owner.user_id

    def anomalies(self, batch_id: str) -> list[dict[str, Any]]:
        batch = self.batch(batch_id)
        return [] if batch is None else list(batch.anomalies)

    def _get(self, cls: type[A], ident: UUID, touched: dict[UUID, Folded]) -> A | None:
        found = touched.get(ident) or self._cache.get(ident)
        if found is None:
            if ident in self._absent:
                return None
            loaded = self._load(cls, ident)
            if loaded is None:
                if len(self._absent) >= ABSENT_KEPT:
                    self._absent.clear()
                self._absent.add(ident)
            return loaded
        assert isinstance(found, cls)
        return found

    def _load(self, cls: type[A], ident: UUID) -> A | None:
        """From the store, never the cache: queries may run beside a fold and must not share its objects."""
        try:
            found: Folded = self.repository.get(ident)
        except AggregateNotFoundError:
            return None
        if not isinstance(found, cls):
            raise TypeError(f"aggregate {ident} is a {type(found).__name__}, not a {cls.__name__}")
        return found
