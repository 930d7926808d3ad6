"""`sheshnag status` whose census has not counted every batch in time shows what was counted, as it says."""

from infra.status import counted_once
from tests.unit.gateway.test_batch_census import Entry, Watch


async def test_a_count_not_finished_in_time_shows_what_was_counted() -> None:
    watch = Watch([Entry("batch_a", "in_progress"), Entry("batch_b", "completed")])  # the end marker never comes

    class Bucket:
        async def watch(self, _: str, **options: object) -> Watch:
            return watch

    counts = await counted_once(Bucket(), wait_s=0.1)  # type: ignore[arg-type]
    assert counts.by_status() == {"in_progress": 1, "completed": 1}
    assert set(counts.open) == {"batch_a"}


async def test_a_finished_count_is_shown_whole() -> None:
    watch = Watch([Entry("batch_a", "validated")])
    watch.queue.put_nowait(None)

    class Bucket:
        async def watch(self, _: str, **options: object) -> Watch:
            return watch

    counts = await counted_once(Bucket(), wait_s=1.0)  # type: ignore[arg-type]
    assert counts.by_status() == {"validated": 1}
