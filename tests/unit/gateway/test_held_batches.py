"""A validated batch created with `hold: true` waits for its owner's release, not for the fleet: the fleet gauges
and `sheshnag status` show it as held, never in the queue's depth or oldest age."""

from prometheus_client import CollectorRegistry, generate_latest

from contracts.api.batch import Batch
from contracts.readmodel import BatchRecord
from infra.status import render
from services.gateway.usecases.overview import Overview, export_gauges, tally
from services.runtime.process import metrics

NOW = 1_700_000_000.0
MODEL = "smollm2-135m-instruct-q4_1"


def validated(batch_id: str, held: bool, age_s: float) -> BatchRecord:
    batch = Batch(id=batch_id, endpoint="/v1/chat/completions", input_file_id="file-in", completion_window="24h",
                  status="validated", created_at=int(NOW - age_s), model=MODEL, held=held or None)
    return BatchRecord(owner_key_id="key-a", batch=batch, last_sequence=1)


def scraped() -> str:
    registry = CollectorRegistry()
    for family in (metrics.QUEUE_DEPTH, metrics.QUEUE_AGE, metrics.HELD):
        registry.register(family)
    return generate_latest(registry).decode()


def test_a_held_batch_on_an_idle_fleet_is_held_not_queued() -> None:
    view = Overview(at=NOW)
    tally(view, validated("batch_held", held=True, age_s=206), NOW)
    assert [held.batch_id for held in view.held] == ["batch_held"] and view.queued == []
    assert view.batches_by_status == {"validated": 1}


def test_the_queue_gauges_count_only_batches_waiting_for_an_executor() -> None:
    view = Overview(at=NOW)
    for record in (validated("batch_held", held=True, age_s=206), validated("batch_queued", held=False, age_s=5)):
        tally(view, record, NOW)
    export_gauges(view)
    text = scraped()
    assert f'sheshnag_queue_depth_batches{{model="{MODEL}"}} 1.0' in text
    assert f'sheshnag_queue_oldest_age_seconds{{model="{MODEL}"}} 5.0' in text
    assert f'sheshnag_held_batches{{model="{MODEL}"}} 1.0' in text


def test_an_idle_fleet_with_only_a_held_batch_has_no_queue() -> None:
    view = Overview(at=NOW)
    tally(view, validated("batch_held", held=True, age_s=206), NOW)
    export_gauges(view)
    text = scraped()
    assert "sheshnag_queue_depth_batches{" not in text and "sheshnag_queue_oldest_age_seconds{" not in text
    assert f'sheshnag_held_batches{{model="{MODEL}"}} 1.0' in text


def test_status_lists_a_held_batch_as_held_not_waiting() -> None:
    view = Overview(at=NOW)
    tally(view, validated("batch_held", held=True, age_s=206), NOW)
    text = render(view)
    assert "Queue (0 validated, waiting)" in text
    held_line = next(line for line in text.splitlines() if "batch_held" in line)
    assert "held 3m26s" in held_line and "waiting" not in held_line
