"""The whole ledger's state at an archived point, as eventsourcing snapshots: taken after refolding a segment onto
the point before it, and seeded into a ledger that then folds only the facts after it. Synchronous, like the library."""

import base64
from collections.abc import Iterable, Sequence
from typing import Any
from uuid import UUID

from eventsourcing.domain import Aggregate, Snapshot
from eventsourcing.persistence import StoredEvent, Tracking

from contracts.readmodel import AnomalyRecord
from contracts.subjects import EVENTS_STREAM
from services.ledger.application import Ledger, persistence_env
from services.ledger.chain import Fact
from services.ledger.folded import Folded
from services.ledger.membership import KeyOwner
from services.ledger.projection import Projection, new_anomalies, records_of, set_aside
from services.ledger.reindex import OWNER_INDEX

PAGE = 10_000
SnapshotLine = dict[str, Any]
"""One aggregate's stored snapshot as the archive writes it: `id`, `version`, `topic`, `state` (base64)."""


def to_line(stored: StoredEvent) -> SnapshotLine:
    return {"id": str(stored.originator_id), "version": stored.originator_version, "topic": stored.topic,
            "state": base64.b64encode(stored.state).decode()}


def from_line(line: SnapshotLine) -> StoredEvent:
    return StoredEvent(originator_id=UUID(line["id"]), originator_version=int(line["version"]),
                       topic=str(line["topic"]), state=base64.b64decode(line["state"]))


def seed(ledger: Ledger, snapshots: Sequence[SnapshotLine], point: int) -> list[StoredEvent]:
    """Make an empty ledger's state that of the point, its fold's checkpoint too (the read model's is the caller's to
    record once the records are in its sink); the snapshots as stored."""
    assert ledger.snapshots is not None
    stored = [from_line(line) for line in snapshots]
    if stored:
        ledger.snapshots.recorder.insert_events(stored)
    ledger.tracking.insert_tracking(Tracking(application_name=EVENTS_STREAM, notification_id=point))
    # Owners came with the snapshot's state: nothing to index again (see reindex).
    ledger.tracking.insert_tracking(Tracking(application_name=OWNER_INDEX, notification_id=1))
    return stored


def projections(ledger: Ledger, seeded: Iterable[StoredEvent]) -> list[Projection]:
    """The read-model record of every aggregate a seed put in `ledger`, each from its snapshot alone (a seeded store
    holds nothing else), without a store read per aggregate, and each batch's owner from the snapshots in hand."""
    aggregates: dict[UUID | str, object] = {}
    for stored in seeded:
        snapshot = ledger.mapper.to_domain_event(stored)
        assert isinstance(snapshot, Snapshot)
        aggregates[stored.originator_id] = snapshot.mutate(None)

    def user_of_key(key_id: str) -> str | None:
        owner = aggregates.get(KeyOwner.create_id(key_id))
        return owner.user_id if isinstance(owner, KeyOwner) else None

    return records_of((aggregate for aggregate in aggregates.values() if isinstance(aggregate, Folded)), user_of_key)


class Refold:
    """A scratch ledger seeded at one point, folding the next segment's facts: its state is the next point's."""

    def __init__(self, previous: Sequence[SnapshotLine], point: int) -> None:
        self.ledger = Ledger(persistence_env(None))
        self.previous = previous
        self.anomalies: list[AnomalyRecord] = []
        if point:
            seed(self.ledger, previous, point)

    def fold(self, facts: list[Fact]) -> None:
        touched = self.ledger.fold_facts(facts)
        self.anomalies += [*new_anomalies(touched, facts), *set_aside(self.ledger.quarantine, facts)]

    def snapshots(self) -> list[SnapshotLine]:
        """Every aggregate's snapshot: those the segment changed taken now, the others as the point before had them."""
        changed: set[UUID] = set()
        recorder = self.ledger.recorder
        start = 1
        while True:
            page = recorder.select_notifications(start=start, limit=PAGE)
            changed.update(UUID(str(notification.originator_id)) for notification in page)
            if len(page) < PAGE:
                break
            start = page[-1].id + 1
        lines = {UUID(line["id"]): line for line in self.previous}
        for ident in changed:
            aggregate: Aggregate = self.ledger.repository.get(ident)
            lines[ident] = to_line(self.ledger.mapper.to_stored_event(type(aggregate).Snapshot.take(aggregate)))
        return [lines[ident] for ident in sorted(lines)]

    def close(self) -> None:
        self.ledger.close()
