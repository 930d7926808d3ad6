"""Providers, their worker keys, the lines each executor served, and anomalies, as the ledger folds them."""

import json

from eventsourcing.domain import Aggregate
from eventsourcing.persistence import StoredEvent

from contracts.events.batch import AttemptFailed, BatchAssigned, BatchCancelled, BatchCancelRequested, BatchProgressed
from contracts.events.envelope import Event
from contracts.events.executor import ExecutorAdvert, ExecutorRegistered
from contracts.events.key import KeyCreated
from contracts.events.provider import ProviderApprovalWithdrawn, ProviderApproved, ProviderRegistered
from contracts.readmodel import AnomalyRecord, ExecutorRecord, ProviderRecord
from services.ledger.aggregates import ApiKey, Executor
from services.ledger.application import Ledger, persistence_env
from services.ledger.chain import Fact
from services.ledger.projection import api_key_record, executor_record, new_anomalies, project, projection_key
from tests.unit.ledger.test_ledger_domain import BATCH, T0, Stream, at, completed, created, started, validated
from tests.unit.ledger.test_ledger_lifecycle import USAGE

KEY = "cd" * 32


def registered(executor_id: str, worker_key_id: str | None = "key_w") -> ExecutorRegistered:
    advert = ExecutorAdvert(executor_id=executor_id, engine="llamacpp", engine_version="1", models=["m"],
                            loaded_models=["m"], devices=[], slots=2, heartbeat_at=T0 * 1000)
    return ExecutorRegistered(aggregate_id=executor_id, advert=advert, started_at=T0 * 1000,
                              worker_key_id=worker_key_id)


def assigned(attempt: int, executor_id: str) -> BatchAssigned:
    return BatchAssigned(aggregate_id=BATCH, executor_id=executor_id, attempt=attempt, lease_token="t",
                         occurred_at=at(3))


def progressed(attempt: int, chunk: int, completed: int, failed: int = 0) -> BatchProgressed:
    return BatchProgressed(aggregate_id=BATCH, attempt=attempt, chunk=chunk, chunk_key=f"c{chunk}",
                           completed=completed, failed=failed, occurred_at=at(5))


def served(ledger: Ledger, executor_id: str) -> int:
    executor = ledger.executor(executor_id)
    assert executor is not None
    return executor_record(executor).lines_served


def two_attempts() -> list[Event]:
    """exec-a makes 3 lines durable, is lost, a late chunk of its adds 2; exec-b runs the rest (4 more, 1 failed)."""
    return [registered("exec-a"), registered("exec-b"), created(), validated(), assigned(1, "exec-a"),
            started(1).model_copy(update={"executor_id": "exec-a"}), progressed(1, 0, 3),
            AttemptFailed(aggregate_id=BATCH, attempt=1, executor_id="exec-a", code="executor_lost",
                          reason="missed heartbeats", occurred_at=at(6)),
            progressed(1, 1, 5), assigned(2, "exec-b"), started(2).model_copy(update={"executor_id": "exec-b"}),
            progressed(2, 2, 7, 1), progressed(2, 3, 8, 1)]


def test_a_registered_provider_is_projected_with_its_owner(ledger: Ledger) -> None:
    (provider,) = ledger.fold([(1, ProviderRegistered(aggregate_id="prov_1", display_name="GPU farm",
                                                      owner_key_id="key_owner", owner_user_id="alice",
                                                      occurred_at=T0 * 1000))])
    projection = project(provider, lambda key_id: None)
    assert projection == ProviderRecord(provider_id="prov_1", display_name="GPU farm", owner_key_id="key_owner",
                                        owner_user_id="alice", created_at=T0)
    assert projection_key(projection) == "provider.prov_1"


def test_a_worker_key_records_its_provider_and_an_admins_worker_key_has_none(ledger: Ledger) -> None:
    admins = "ab" * 32
    ledger.fold([(1, KeyCreated(aggregate_id=KEY[:32], key_sha256=KEY, role="worker", label="rack 1",
                                provider_id="prov_1")),
                 (2, KeyCreated(aggregate_id=admins[:32], key_sha256=admins, role="worker", label="ops"))])
    provider_key, admin_key = ledger.api_key(KEY), ledger.api_key(admins)
    assert provider_key is not None and admin_key is not None
    assert (api_key_record(provider_key).provider_id, api_key_record(admin_key).provider_id) == ("prov_1", None)


def test_each_executor_is_credited_the_lines_its_attempts_made_durable(ledger: Ledger) -> None:
    Stream(ledger).fold(*two_attempts())
    assert (served(ledger, "exec-a"), served(ledger, "exec-b")) == (5, 4)
    executor = ledger.executor("exec-b")
    assert executor is not None
    assert executor_record(executor) == ExecutorRecord(
        executor_id="exec-b", engine="llamacpp", engine_version="1", models=["m"], worker_key_id="key_w",
        status="online", started_at=T0 * 1000, lines_served=4)


def test_lines_served_are_the_same_whatever_the_grouping_of_the_facts(ledger: Ledger) -> None:
    facts = list(enumerate(two_attempts(), start=1))
    ledger.fold(facts)  # one group: runs of progress are deferred and merged
    one_by_one = Ledger(persistence_env(None))
    try:
        for seq_fact in facts:
            one_by_one.fold([seq_fact])
        assert (served(one_by_one, "exec-a"), served(one_by_one, "exec-b")) == (
            served(ledger, "exec-a"), served(ledger, "exec-b")) == (5, 4)
    finally:
        one_by_one.close()


def test_facts_delivered_again_credit_no_line_twice(ledger: Ledger) -> None:
    facts = list(enumerate(two_attempts(), start=1))
    ledger.fold(facts)
    ledger.fold(facts[4:])  # a redelivery after a crash between folding and acknowledging
    assert (served(ledger, "exec-a"), served(ledger, "exec-b")) == (5, 4)


def test_an_executor_unknown_to_the_ledger_is_credited_nothing_and_the_batch_still_progresses(
        ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(created(), validated(), assigned(1, "exec-ghost"), started(1), progressed(1, 0, 3))
    assert ledger.executor("exec-ghost") is None and stream.record().batch.request_counts.completed == 3


def test_a_refused_fact_is_projected_as_an_anomaly_timed_by_that_fact(ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(created(), validated(), started(),
                BatchCancelRequested(aggregate_id=BATCH, requested_by_key_id="key_a", occurred_at=at(7)),
                BatchCancelled(aggregate_id=BATCH, output_file_id=None, error_file_id=None, completed=0, failed=0,
                               usage=USAGE, occurred_at=at(8)))
    late = completed()
    facts = [Fact(stream.seq + 1, late.subject, late.model_dump_json().encode())]
    touched = ledger.fold_facts(facts)
    assert new_anomalies(touched, facts) == [AnomalyRecord(
        sequence=stream.seq + 1, aggregate_kind="batch", aggregate_id=BATCH, event_type="batch.completed",
        reason="completed is not allowed while cancelled", occurred_at=T0 + 9)]
    assert projection_key(new_anomalies(touched, facts)[0]) == f"anomaly.{stream.seq + 1}.batch"


def test_anomalies_of_earlier_groups_are_not_projected_again(ledger: Ledger) -> None:
    key = KeyCreated(aggregate_id=KEY[:32], key_sha256=KEY, role="user", label="k")
    again = [Fact(2, key.subject, key.model_copy(update={"event_id": "again"}).model_dump_json().encode())]
    ledger.fold([(1, key)])
    touched = ledger.fold_facts(again)
    [anomaly] = new_anomalies(touched, again)
    assert (anomaly.aggregate_kind, anomaly.aggregate_id, anomaly.event_type) == (
        "key", "key_" + "cd" * 8, "key.created")
    later = [Fact(3, key.subject, key.model_copy(update={"event_id": "later", "label": "x"}).model_dump_json()
                  .encode())]
    touched = ledger.fold_facts(later)
    assert [a.sequence for a in new_anomalies(touched, later)] == [3]


def store_older_snapshot(ledger: Ledger, aggregate: Aggregate, drop: tuple[str, ...], class_version: int) -> None:
    """Overwrite the aggregate's snapshot with one an older ledger wrote: without `drop`, at `class_version`."""
    assert ledger.snapshots is not None
    snapshot = ledger.mapper.to_stored_event(type(aggregate).Snapshot.take(aggregate))
    state = json.loads(snapshot.state)
    for field in drop:
        del state["state"][field]
    state["state"]["class_version"] = class_version
    ledger.snapshots.recorder.insert_events([StoredEvent(
        originator_id=snapshot.originator_id, originator_version=snapshot.originator_version,
        topic=snapshot.topic, state=json.dumps(state).encode())])


def test_an_executor_snapshot_from_before_lines_served_is_upcast_without_them(ledger: Ledger) -> None:
    ledger.fold([(1, registered("exec-old"))])
    executor = ledger.executor("exec-old")
    assert executor is not None
    store_older_snapshot(ledger, executor, ("worker_key_id", "last_heartbeat_at", "lines_served"), 1)

    reloaded: Aggregate = ledger.repository.get(executor.id)
    assert isinstance(reloaded, Executor)
    assert (reloaded.worker_key_id, reloaded.last_heartbeat_at, reloaded.lines_served) == (None, None, 0)


def test_a_key_snapshot_from_before_providers_is_upcast_without_one(ledger: Ledger) -> None:
    ledger.fold([(1, KeyCreated(aggregate_id=KEY[:32], key_sha256=KEY, role="worker", label="w"))])
    key = ledger.api_key(KEY)
    assert key is not None
    store_older_snapshot(ledger, key, ("provider_id",), 2)

    reloaded: Aggregate = ledger.repository.get(key.id)
    assert isinstance(reloaded, ApiKey) and reloaded.provider_id is None and reloaded.role == "worker"


def approval(approved: bool, organization_id: str | None, seq: int) -> ProviderApproved | ProviderApprovalWithdrawn:
    if approved:
        return ProviderApproved(aggregate_id="prov_1", organization_id=organization_id, approved_by_key_id="key_a",
                                occurred_at=at(seq))
    return ProviderApprovalWithdrawn(aggregate_id="prov_1", organization_id=organization_id,
                                     withdrawn_by_key_id="key_a", occurred_at=at(seq))


def test_a_provider_is_unapproved_until_approved_and_each_approval_can_be_withdrawn(ledger: Ledger) -> None:
    ledger.fold([(1, ProviderRegistered(aggregate_id="prov_1", display_name="GPU farm", owner_key_id="key_owner",
                                        occurred_at=T0 * 1000))])
    steps = [(approval(True, "org_x", 2), False, ["org_x"]), (approval(True, None, 3), True, ["org_x"]),
             (approval(True, "org_x", 4), True, ["org_x"]), (approval(False, None, 5), False, ["org_x"]),
             (approval(False, "org_x", 6), False, [])]
    for seq, (fact, platform_wide, organizations) in enumerate(steps, start=2):
        (provider,) = ledger.fold([(seq, fact)])
        record = project(provider, lambda key_id: None)
        assert isinstance(record, ProviderRecord)
        assert (record.approved_platform_wide, record.approved_organizations) == (platform_wide, organizations)
    (provider,) = ledger.fold([(3, approval(True, None, 3))])  # delivered again: already folded, no change
    record = project(provider, lambda key_id: None)
    assert isinstance(record, ProviderRecord) and not record.approved_platform_wide


def test_the_batch_shows_its_placement_and_each_attempts_executor_and_provider(ledger: Ledger) -> None:
    stream = Stream(ledger)
    provider_executor = registered("exec-p").model_copy(update={"provider_id": "prov_1"})
    stream.fold(provider_executor, registered("exec-ops", None),
                created().model_copy(update={"placement": "own_organization"}), validated(), assigned(1, "exec-p"),
                AttemptFailed(aggregate_id=BATCH, attempt=1, executor_id="exec-p", code="executor_lost",
                              reason="missed heartbeats", occurred_at=at(6)),
                assigned(2, "exec-ops"))
    batch = stream.record().batch
    assert batch.placement == "own_organization"
    assert [(a.attempt, a.executor_id, a.provider_id) for a in batch.attempts or []] == [
        (1, "exec-p", "prov_1"), (2, "exec-ops", None)]
