"""The heap report a traced service logs on SIGUSR2: the first names the largest holders, the next what grew since,
by the traceback that allocated it."""

import logging
import tracemalloc

import pytest

from services.runtime.process.heap_diff import HeapDiff


async def test_the_second_report_names_where_memory_grew_since_the_first(caplog: pytest.LogCaptureFixture) -> None:
    tracemalloc.start(8)
    try:
        heap = HeapDiff()
        with caplog.at_level(logging.WARNING, "services.runtime.process.heap_diff"):
            await heap.report()
            kept = [bytearray(1000) for _ in range(2000)]
            await heap.report()
    finally:
        tracemalloc.stop()

    # Only the heap's own lines: other tests' services may still log in this process's event loop meanwhile.
    first, second = (record.getMessage() for record in caplog.records
                     if record.name == "services.runtime.process.heap_diff")
    assert first.startswith("heap:") and "largest holders" in first
    assert "grown most" in second and "kept = [bytearray(1000)" in second
    assert all(" MB traced " in report and ", RSS " in report for report in (first, second))  # objects vs process
    assert len(kept) == 2000
