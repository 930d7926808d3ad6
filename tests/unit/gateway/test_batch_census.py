"""The batch census counts each batch once, under its latest status, whatever order and how often its records come."""

import asyncio

import pytest

from contracts.api.batch import Batch
from contracts.api.batch import BatchStatus as Status
from contracts.readmodel import BatchRecord
from contracts.subjects import read_model_key
from services.gateway.background.batch_census import BatchCensus, RateWindow


def record(batch_id: str, status: Status) -> BatchRecord:
    batch = Batch(id=batch_id, endpoint="/v1/chat/completions", input_file_id="file-1", completion_window="24h",
                  status=status, created_at=1_700_000_000, model="m")
    return BatchRecord(owner_key_id="key_1", batch=batch, last_sequence=1)


def test_a_batch_moves_from_status_to_status_and_is_counted_once() -> None:
    census = BatchCensus()
    for status in ("validating", "validated", "in_progress", "finalizing", "completed"):
        census.record("batch_a", record("batch_a", status))
    census.record("batch_b", record("batch_b", "in_progress"))

    assert census.by_status() == {"completed": 1, "in_progress": 1}
    assert set(census.open) == {"batch_b"}


def test_an_ended_batch_whose_record_is_written_again_is_not_counted_twice() -> None:
    census = BatchCensus()
    census.record("batch_a", record("batch_a", "cancelled"))
    census.record("batch_a", record("batch_a", "cancelled"))

    assert census.by_status() == {"cancelled": 1}


def test_a_deleted_record_is_no_longer_counted_and_a_reset_forgets_everything() -> None:
    census = BatchCensus()
    census.record("batch_a", record("batch_a", "failed"))
    census.record("batch_b", record("batch_b", "validated"))
    census.record("batch_a", None)

    assert census.by_status() == {"validated": 1}
    census.reset()
    assert census.by_status() == {} and census.open == {}


class Entry:
    def __init__(self, batch_id: str, status: Status | None, shown: BatchRecord | None = None) -> None:
        self.key = f"batch.{batch_id}"
        shown = shown or (record(batch_id, status) if status else None)
        self.value = shown.model_dump_json().encode() if shown else b""
        self.revision = 1


class Watch:
    """A read model's watch: the current values, the end-of-values marker, then each change as it is fed."""

    def __init__(self, current: list[Entry]) -> None:
        self.queue: asyncio.Queue[Entry | None] = asyncio.Queue()
        for entry in current:
            self.queue.put_nowait(entry)
        self.stopped = False

    def __aiter__(self) -> "Watch":
        return self

    async def __anext__(self) -> Entry | None:
        return await self.queue.get()

    async def stop(self) -> None:
        self.stopped = True


async def test_a_count_replaces_the_last_only_once_complete_then_follows_each_change() -> None:
    census = BatchCensus()
    census.record("batch_old", record("batch_old", "completed"))  # what a previous count showed
    watch = Watch([Entry("batch_a", "completed"), Entry("batch_b", "in_progress")])

    class Bucket:
        async def watch(self, _: str, **options: object) -> Watch:
            return watch

    following = asyncio.create_task(census.follow(Bucket()))  # type: ignore[arg-type]
    await asyncio.sleep(0.05)
    assert census.by_status() == {"completed": 1} and not census.ready.is_set()  # half a count is never shown

    watch.queue.put_nowait(None)
    await asyncio.sleep(0.05)
    assert census.ready.is_set() and census.by_status() == {"completed": 1, "in_progress": 1}

    watch.queue.put_nowait(Entry("batch_b", "cancelled"))
    watch.queue.put_nowait(Entry("batch_a", None))
    await asyncio.sleep(0.05)
    assert census.by_status() == {"cancelled": 1}

    following.cancel()
    await asyncio.gather(following, return_exceptions=True)
    assert watch.stopped


def running_record(batch_id: str, status: Status, model: str, total: int, done: int, *, started: int | None = None,
                   ended: int | None = None) -> BatchRecord:
    batch = Batch(id=batch_id, endpoint="/v1/chat/completions", input_file_id="file-1", completion_window="24h",
                  status=status, created_at=1_700_000_000, model=model, in_progress_at=started,
                  completed_at=ended, request_counts={"total": total, "completed": done, "failed": 0})
    return BatchRecord(owner_key_id="key_1", batch=batch, last_sequence=1)


def test_a_quotes_queue_is_the_models_lines_still_to_run_and_the_lines_it_ran_in_the_last_hour() -> None:
    now = 1_700_010_000.0
    census = BatchCensus()
    census.record("batch_a", running_record("batch_a", "validated", "m", 100, 0), now)
    census.record("batch_b", running_record("batch_b", "in_progress", "m", 50, 20, started=int(now) - 100), now)
    census.record("batch_other", running_record("batch_other", "validated", "other", 7, 0), now)
    assert census.queue("m", now) == (130, None)

    census.record("batch_b", running_record("batch_b", "completed", "m", 50, 50, started=int(now) - 100,
                                            ended=int(now)), now)
    census.record("batch_b", running_record("batch_b", "completed", "m", 50, 50, started=int(now) - 100,
                                            ended=int(now)), now)  # the ended record written again
    assert census.queue("m", now) == (100, 0.5)  # 50 lines in the 100 s since it started
    assert census.queue("other", now) == (7, None)

    assert census.queue("m", now + 3601) == (100, None)  # the hour has passed
    census.record("batch_a", None, now)
    assert census.queue("m", now) == (0, None)


async def test_a_quotes_queue_follows_the_watch_across_a_count() -> None:
    census = BatchCensus()
    watch = Watch([Entry("batch_a", None, running_record("batch_a", "validated", "m", 10, 0))])

    class Bucket:
        async def watch(self, _: str, **options: object) -> Watch:
            return watch

    following = asyncio.create_task(census.follow(Bucket()))  # type: ignore[arg-type]
    watch.queue.put_nowait(None)
    await asyncio.sleep(0.05)
    assert census.queue("m", 1_700_010_000.0) == (10, None)

    watch.queue.put_nowait(Entry("batch_b", None, running_record("batch_b", "in_progress", "m", 5, 1)))
    await asyncio.sleep(0.05)
    assert census.queue("m", 1_700_010_000.0) == (14, None)
    following.cancel()
    await asyncio.gather(following, return_exceptions=True)


def test_a_models_rate_is_its_lines_over_the_window_since_its_earliest_start_as_batches_leave_it() -> None:
    window = RateWindow()
    for ended, started, lines in ((1000.0, 900.0, 10), (2000.0, 100.0, 20), (3000.0, 2500.0, 30)):
        window.add(ended, started, lines)

    assert window.rate(3000.0) == pytest.approx(60 / 2900)
    assert window.rate(4700.0) == pytest.approx(50 / 3600)  # the first left; the second started before the window
    assert window.rate(5700.0) == pytest.approx(30 / 3200)  # only the last is left: from its start
    assert window.rate(7000.0) is None and window.done == 0 and not window.earliest


def test_counting_an_ended_batch_copies_no_window_of_ended_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each ended batch only drops the runs that left the share window: copying the window at each end made a count
    quadratic in the batches that ended within it (20,000 ends in 5 minutes: 8.4 s of the gateway's loop, not 0.2 s)."""
    now = 1_700_010_000.0
    census = BatchCensus()

    def copied(*args: object, **kwargs: object) -> list[object]:
        raise AssertionError("the window was copied while counting")

    monkeypatch.setattr(BatchCensus, "runs_ended_within", copied)
    for i in range(3):
        census.record(f"batch_{i}", running_record(f"batch_{i}", "completed", "m", 5, 5, started=int(now) - 100,
                                                   ended=int(now) - 10 + i), now)
    monkeypatch.undo()
    assert len(census.runs_ended_within(now)) == 3
    assert census.runs_ended_within(now + 400) == [] and not census.ended_runs  # past the window: dropped


def test_a_change_during_a_recount_shows_at_once_and_the_recount_still_replaces_the_counts() -> None:
    census = BatchCensus()
    census.restart()
    census.put(read_model_key("batch", "batch_r"), record("batch_r", "in_progress").model_dump_json().encode(), 1)
    census.current()
    census.restart()  # the hourly recount begins
    census.put(read_model_key("batch", "batch_r"), record("batch_r", "cancelled").model_dump_json().encode(), 2)
    assert census.by_status() == {"cancelled": 1}  # not frozen until the recount completes
    census.current()
    assert census.by_status() == {"cancelled": 1}
