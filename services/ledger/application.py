"""The ledger application: folds groups of stream facts into aggregates, keeps the checkpoint, answers queries.

Synchronous like the eventsourcing library under it; callers on an event loop use `asyncio.to_thread`.
"""

import logging
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

from eventsourcing.application import AggregateNotFoundError, Application
from eventsourcing.persistence import ProcessRecorder, Tracking

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
from contracts.events.envelope import Event
from contracts.events.file import FileDeleted, FileStored
from contracts.events.key import KeyCreated
from contracts.subjects import EVENTS_STREAM
from services.ledger.domainmodel import ApiKey, Batch, File, Folded, aggregate_id, register_stable_topics

log = logging.getLogger(__name__)

A = TypeVar("A", bound=Folded)


def persistence_env(db_path: Path | None) -> dict[str, str]:
    """SQLite when a file is named, else in memory (POPO)."""
    if db_path is None:
        return {"PERSISTENCE_MODULE": "eventsourcing.popo"}
    return {"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": str(db_path)}


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

    def construct_recorder(self) -> ProcessRecorder:
        return self.factory.process_recorder()

    @property
    def tracking(self) -> ProcessRecorder:
        assert isinstance(self.recorder, ProcessRecorder)
        return self.recorder

    # Commands

    def fold(self, facts: Sequence[tuple[int, Event]]) -> list[Folded]:
        """Apply facts in stream order and save them in one transaction; return every aggregate they touched.

        A fact at or below an aggregate's last sequence changes nothing, but its aggregate is still returned:
        a crash may have come between saving it and materialising it.
        """
        touched: dict[UUID, Folded] = {}
        try:
            for sequence, fact in facts:
                aggregate = self._apply(sequence, fact, touched)
                if aggregate is not None:
                    touched[aggregate.id] = aggregate
            recordings = self.save(*touched.values())
        except BaseException:
            self._cache.clear()  # cached aggregates may hold changes that were never saved
            raise
        self._snapshot({r.domain_event.originator_id for r in recordings
                        if r.domain_event.originator_version % self.snapshot_every == 0}, touched)
        for ident, aggregate in touched.items():
            self._cache[ident] = aggregate
            self._cache.move_to_end(ident)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return list(touched.values())

    def _snapshot(self, due: set[UUID], touched: dict[UUID, Folded]) -> None:
        # From the state in hand: the library's own snapshotting would refold the aggregate from the store.
        assert self.snapshots is not None
        self.snapshots.put([touched[ident].Snapshot.take(touched[ident]) for ident in due])

    def record_checkpoint(self, sequence: int) -> None:
        """Every fact up to `sequence` is folded and materialised."""
        self.tracking.insert_tracking(Tracking(application_name=EVENTS_STREAM, notification_id=sequence))

    # Queries

    def checkpoint(self) -> int:
        return self.tracking.max_tracking_id(EVENTS_STREAM) or 0

    def batch(self, batch_id: str) -> Batch | None:
        return self._load(Batch, aggregate_id("batch", batch_id))

    def file(self, file_id: str) -> File | None:
        return self._load(File, aggregate_id("file", file_id))

    def api_key(self, key_sha256: str) -> ApiKey | None:
        return self._load(ApiKey, aggregate_id("apikey", key_sha256))

    def anomalies(self, batch_id: str) -> list[dict[str, Any]]:
        batch = self.batch(batch_id)
        return [] if batch is None else list(batch.anomalies)

    # Folding one fact

    def _apply(self, seq: int, fact: Event, touched: dict[UUID, Folded]) -> Folded | None:
        at = fact.occurred_at // 1000
        match fact:
            case BatchCreated():
                return self._found_again(Batch, "batch", fact.aggregate_id, seq, fact, touched) or Batch(
                    batch_id=fact.aggregate_id, sequence=seq, owner_key_id=fact.owner_key_id,
                    input_file_id=fact.input_file_id, endpoint=fact.endpoint,
                    completion_window=fact.completion_window, metadata=fact.metadata,
                    created_at=fact.created_at, expires_at=fact.expires_at)
            case FileStored():
                return self._found_again(File, "file", fact.aggregate_id, seq, fact, touched) or File(
                    file_id=fact.aggregate_id, sequence=seq, owner_key_id=fact.owner_key_id,
                    filename=fact.filename, purpose=fact.purpose, size=fact.bytes, sha256=fact.sha256,
                    object_key=fact.object_key, created_at=fact.created_at)
            case KeyCreated():
                return self._found_again(ApiKey, "apikey", fact.key_sha256, seq, fact, touched) or ApiKey(
                    key_sha256=fact.key_sha256, sequence=seq, role=fact.role, label=fact.label)
            case FileDeleted():
                file = self._existing(File, "file", seq, fact, touched)
                if file is not None:
                    file.delete(seq)
                return file
        batch = self._existing(Batch, "batch", seq, fact, touched) if fact.kind == "batch" else None
        if batch is None:
            if fact.kind != "batch":
                log.debug("sequence %d: %s is not the ledger's concern", seq, fact.type)
            return None
        match fact:
            case LineRejected():
                batch.reject_line(seq, fact.line, fact.code, fact.param, fact.message)
            case BatchValidated():
                batch.validate(seq, at, fact.model, fact.total_lines)
            case BatchValidationFailed():
                batch.fail_validation(seq, at, fact.total_lines, fact.error_count, fact.counts_by_code)
            case BatchAssigned():
                batch.assign(seq, fact.executor_id, fact.attempt)
            case BatchStarted():
                batch.start(seq, at, fact.executor_id, fact.attempt, fact.engine, fact.engine_version)
            case BatchProgressed():
                batch.progress(seq, fact.completed, fact.failed)
            case BatchFinalizing():
                batch.finalize(seq, at)
            case BatchCompleted():
                batch.complete(seq, at, fact.output_file_id, fact.error_file_id, fact.completed, fact.failed,
                               fact.usage.model_dump())
            case BatchFailed():
                batch.fail(seq, at, fact.code, fact.reason)
            case _:
                log.warning("sequence %d: no folding rule for %s", seq, fact.type)
        return batch

    def _found_again(self, cls: type[A], kind: str, ident: str, seq: int, fact: Event,
                     touched: dict[UUID, Folded]) -> A | None:
        """The aggregate a creating fact names, when it exists already (an anomaly unless a redelivery)."""
        existing = self._get(cls, aggregate_id(kind, ident), touched)
        if existing is not None:
            existing.note_anomaly(seq, fact.name, f"{fact.type} for an existing {kind}")
        return existing

    def _existing(self, cls: type[A], kind: str, seq: int, fact: Event, touched: dict[UUID, Folded]) -> A | None:
        found = self._get(cls, aggregate_id(kind, fact.aggregate_id), touched)
        if found is None:
            log.warning("sequence %d: %s for unknown %s %s, skipped", seq, fact.type, kind, fact.aggregate_id)
        return found

    def _get(self, cls: type[A], ident: UUID, touched: dict[UUID, Folded]) -> A | None:
        found = touched.get(ident) or self._cache.get(ident)
        if found is None:
            return self._load(cls, ident)
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
