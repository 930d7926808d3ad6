"""One fact no rule can fold cannot stop the ledger for every tenant: a fact whose rule raises is folded once more
from the stored state, and raising again it is set aside — linked in the hash chain like every fact, shown as an
anomaly, folded by no rule — while the facts before and after it, in its group and later ones, fold as usual. A
failure of the store is never set aside: it is the group's, and the group is tried again whole."""

from collections.abc import Iterator, Sequence

import pytest
from eventsourcing.persistence import OperationalError

from contracts.api.batch import BatchUsage
from contracts.events.batch import BatchProgressed
from contracts.events.envelope import Event
from contracts.readmodel import AnomalyRecord, BatchRecord
from services.ledger.application import Ledger
from services.ledger.chain import Fact
from services.ledger.domainmodel import Batch
from services.ledger.projection import folded_records
from tests.factories import batch_life

POISONED = "batch_poisoned"


def facts_of(*batch_ids: str, first: int = 1) -> list[Fact]:
    events: list[Event] = [event for batch_id in batch_ids for event in batch_life(batch_id, chunks=2)]
    return [Fact(sequence, event.subject, event.model_dump_json().encode())
            for sequence, event in enumerate(events, first)]


@pytest.fixture
def validation_fails_for_one_batch(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The rule for `batch.validated` raises, every time, for the poisoned batch alone (a fact no rule foresaw)."""
    validate, raised = Batch.validate, []

    def poisoned(batch: Batch, *args: object, **kwargs: object) -> None:
        if batch.batch_id == POISONED:
            raised.append(batch.batch_id)
            raise KeyError("a state no rule foresaw")
        validate(batch, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Batch, "validate", poisoned)
    yield raised


def statuses(records: Sequence[object]) -> dict[str, str]:
    return {record.batch.id: record.batch.status for record in records if isinstance(record, BatchRecord)}


def test_a_fact_that_raises_twice_is_set_aside_and_the_rest_fold(
        ledger: Ledger, validation_fails_for_one_batch: list[str]) -> None:
    facts = facts_of("batch_before", POISONED, "batch_after")
    records = folded_records(ledger, facts)

    assert len(validation_fails_for_one_batch) == 2, "tried once more from the stored state, then set aside"
    assert statuses(records)["batch_before"] == statuses(records)["batch_after"] == "completed"
    validated = next(fact for fact in facts if fact.subject.endswith(f"{POISONED}.validated"))
    set_aside = [record for record in records
                 if isinstance(record, AnomalyRecord) and "could not be folded" in record.reason]
    assert [(a.sequence, a.aggregate_kind, a.aggregate_id, a.event_type) for a in set_aside] == [
        (validated.sequence, "batch", POISONED, "batch.validated")]
    assert "KeyError" in set_aside[0].reason
    assert statuses(records)[POISONED] == "validating", "its later facts do not fit it: anomalies of their own"
    assert ledger.tracking.max_tracking_id("EVENTS") == facts[-1].sequence, "the group is checkpointed whole"
    assert ledger.quarantine.reasons == {}, "nothing is kept of it once its group is folded"

    later = folded_records(ledger, facts_of("batch_later", first=facts[-1].sequence + 1))
    assert statuses(later) == {"batch_later": "completed"}


def test_a_failure_of_the_store_is_never_set_aside(ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    def store_down(batch: Batch, *args: object, **kwargs: object) -> None:
        raise OperationalError("the database is locked")

    monkeypatch.setattr(Batch, "validate", store_down)
    for _ in range(3):
        with pytest.raises(OperationalError):
            folded_records(ledger, facts_of("batch_waiting"))
    assert ledger.quarantine.reasons == {}


def test_a_fault_in_a_run_of_progress_sets_aside_the_one_fact_that_caused_it(
        ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    """Progress facts are merged into runs; a fault applying a run names only its last fact, so the group is folded
    again fact by fact and only the fact at fault is set aside, however the facts were grouped."""
    progress = Batch.progress

    def poisoned(batch: Batch, sequence: int, *args: object) -> None:
        chunks = args[-1]
        if isinstance(chunks, tuple) and "c1" in chunks:  # the run's chunks (a merged run holds several)
            raise ValueError("a chunk no rule foresaw")
        progress(batch, sequence, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Batch, "progress", poisoned)
    usage = BatchUsage(input_tokens=3, output_tokens=2, total_tokens=5)
    events: list[Event] = [event.model_copy(update={"usage": usage}) if isinstance(event, BatchProgressed) else event
                           for event in batch_life("batch_run", chunks=4)]
    facts = [Fact(sequence, event.subject, event.model_dump_json().encode())
             for sequence, event in enumerate(events, 1)]
    records = folded_records(ledger, facts)

    set_aside = [record.event_type for record in records
                 if isinstance(record, AnomalyRecord) and "could not be folded" in record.reason]
    c1 = next(fact.sequence for fact in facts if b'"chunk_key":"c1"' in fact.data)
    assert [record.sequence for record in records if isinstance(record, AnomalyRecord)
            and "could not be folded" in record.reason] == [c1] and set_aside == ["batch.progressed"]
    assert statuses(records) == {"batch_run": "completed"}
