"""A ledger seeded from an archived snapshot projects every aggregate as the ledger that folded the history does:
the records are rebuilt from the snapshots in hand (no store read each), owners included."""

from uuid import UUID

from contracts.events.key import UserCreated
from contracts.ids import key_id_for_hash
from contracts.readmodel import BatchRecord, FileRecord
from services.ledger.application import Ledger, persistence_env
from services.ledger.folded import Folded
from services.ledger.projection import Projection, project, projection_key
from services.ledger.snapshot import Refold, SnapshotLine, projections, seed
from tests.unit.ledger.test_organizations import LAPTOP, LONE, PHONE, created, key, stored


def dumped(records: list[Projection]) -> dict[str, object]:
    return {projection_key(record): record for record in records}


def projected_from_store(ledger: Ledger, lines: list[SnapshotLine]) -> list[Projection]:
    """The records as the repository gives each aggregate (the way seeding projected them before)."""
    found = []
    for line in lines:
        aggregate: object = ledger.repository.get(UUID(line["id"]))
        if isinstance(aggregate, Folded) and (projection := project(aggregate, ledger.user_of_key)) is not None:
            found.append(projection)
    return found


def test_a_seeded_ledger_projects_every_aggregate_as_the_ledger_that_folded_the_history() -> None:
    refold = Refold([], 0)
    refold.ledger.fold([(1, UserCreated(aggregate_id="alice")), (2, key(LAPTOP, "alice")), (3, key(PHONE, "alice")),
                        (4, key(LONE, None))])
    refold.ledger.fold([(5, stored("f1", LAPTOP)), (6, created("b1", PHONE)), (7, created("b2", LONE))])
    lines = refold.snapshots()
    expected = dumped(projected_from_store(refold.ledger, lines))
    refold.close()

    seeded = Ledger(persistence_env(None))
    try:
        records = dumped(projections(seeded, seed(seeded, lines, 7)))
        assert records == dumped(projected_from_store(seeded, lines)) == expected
    finally:
        seeded.close()
    owners = {record.batch.id if isinstance(record, BatchRecord) else record.file.id:
              (record.owner_key_id, record.owner_user_id)
              for record in records.values() if isinstance(record, BatchRecord | FileRecord)}
    assert owners == {"f1": (key_id_for_hash(LAPTOP), "alice"), "b1": (key_id_for_hash(PHONE), "alice"),
                      "b2": (key_id_for_hash(LONE), None)}
