"""What the scheduler's metrics count: its book's batches by state, its acts by kind and code; no label names a
batch, key or executor."""

from prometheus_client import CollectorRegistry

from services.runtime.process import metrics
from services.scheduler.book import BatchPlan, Book, ShardRun
from services.scheduler.decisions import Assign, DeclareLost, FenceAttempt
from services.scheduler.observe import export_book, leading, note_action, plan_state
from tests.factories import batch_terms


def plan(batch_id: str, phase: str = "validated", held: bool = False, running: bool = False) -> BatchPlan:
    made = BatchPlan(batch_id, batch_terms("key_owner", "files/f", expires_at=0), held=held)
    made.phase = "validating" if phase == "validating" else "validated"
    if running:
        made.shards[0] = ShardRun(attempt=1, executor_id="exec-1")
        made.reindex(0)
    return made


def registry() -> CollectorRegistry:
    scraped = CollectorRegistry()
    for family in (metrics.SCHEDULER_LEADER, metrics.SCHEDULER_BATCHES, metrics.SCHEDULER_ASSIGNMENTS,
                   metrics.SCHEDULER_FENCED, metrics.SCHEDULER_EXECUTORS_LOST):
        scraped.register(family)
    return scraped


def test_each_unfinished_batch_has_one_state_and_a_held_one_is_not_queued() -> None:
    assert [plan_state(p) for p in (plan("a", "validating"), plan("b"), plan("c", held=True),
                                    plan("d", running=True))] == ["validating", "queued", "held", "running"]


def test_the_leaders_book_is_exported_by_state_and_a_standby_exports_none() -> None:
    book = Book(open={p.batch_id: p for p in (plan("a", held=True), plan("b", held=True), plan("c"))})
    scraped = registry()
    leading(True)
    export_book(book)
    assert scraped.get_sample_value("sheshnag_scheduler_leader") == 1.0
    assert [scraped.get_sample_value("sheshnag_scheduler_batches", {"state": state})
            for state in ("validating", "queued", "held", "running")] == [0.0, 1.0, 2.0, 0.0]
    leading(False)
    assert scraped.get_sample_value("sheshnag_scheduler_leader") == 0.0
    assert scraped.get_sample_value("sheshnag_scheduler_batches", {"state": "held"}) is None


def test_acts_are_counted_by_kind_and_code_never_by_batch_or_executor() -> None:
    scraped = registry()

    def value(name: str, **labels: str) -> float:
        return scraped.get_sample_value(name, labels) or 0.0

    before = (value("sheshnag_scheduler_assignments_total", kind="first"),
              value("sheshnag_scheduler_assignments_total", kind="retry"),
              value("sheshnag_scheduler_attempts_fenced_total", code="executor_lost"),
              value("sheshnag_scheduler_executors_lost_total"))
    running = plan("batch_a", running=True)
    note_action(Assign(running, "exec-1", 1))
    note_action(Assign(running, "exec-2", 2), retry=True)
    note_action(FenceAttempt(running, 2, "exec-2", "executor_lost", "no heartbeats"))
    note_action(DeclareLost("exec-2", 0))
    after = (value("sheshnag_scheduler_assignments_total", kind="first"),
             value("sheshnag_scheduler_assignments_total", kind="retry"),
             value("sheshnag_scheduler_attempts_fenced_total", code="executor_lost"),
             value("sheshnag_scheduler_executors_lost_total"))
    assert [a - b for a, b in zip(after, before, strict=True)] == [1.0, 1.0, 1.0, 1.0]
    for family in scraped.collect():
        for sample in family.samples:
            assert not any(v.startswith(("batch_", "exec-", "key_")) for v in sample.labels.values()), sample
