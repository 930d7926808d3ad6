"""A batch's audit timeline is shown whatever its facts hold: a time no calendar holds (stated before the fact desk
bounded executors' times) is shown as milliseconds, and metadata shaped like the ledger store's own encoding reads
back from the scratch ledger the timeline folds into."""

from contracts.events.batch import BatchAssigned, BatchStarted, BatchValidated
from contracts.events.envelope import Event
from services.ledger.timeline import timeline
from tests.factories import batch_created

BATCH = "batch_0123456789abcdef01234567"


def test_a_time_no_calendar_holds_is_shown_as_milliseconds() -> None:
    facts: list[Event] = [batch_created(BATCH), BatchValidated(aggregate_id=BATCH, total_lines=1, model="m"),
                          BatchAssigned(aggregate_id=BATCH, executor_id="exec-1", attempt=1, lease_token="t"),
                          BatchStarted(aggregate_id=BATCH, executor_id="exec-1", attempt=1, engine="llamacpp",
                                       engine_version="1", occurred_at=-(2**80))]
    rows = timeline(list(enumerate(facts, 1)))
    assert rows[-1].time == f"{-(2**80)} ms" and rows[0].time.endswith("+00:00")


def test_metadata_shaped_like_a_custom_type_does_not_break_the_timeline() -> None:
    created = batch_created(BATCH).model_copy(update={"metadata": {"_type_": "nope", "_data_": "x"}})
    assert [row.type for row in timeline([(1, created)])] == ["batch.created"]
