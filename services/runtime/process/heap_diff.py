"""Finding leaks: with `SHESHNAG_TRACEMALLOC=1` (tracing costs memory and time) each SIGUSR2 logs where memory grew
since the previous one, by file and line (the first: the largest holders). Send it at two quiet points around a wave
of load. RSS that grows while traced memory does not is the allocator keeping a peak, not objects kept."""

import asyncio
import linecache
import logging
import os
import signal
import tracemalloc

log = logging.getLogger(__name__)
ENV = "SHESHNAG_TRACEMALLOC"
FRAMES = 8
TOP = 25


def rss_mb() -> float | None:
    """This process's resident memory now (Linux), None where it cannot be read."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return None


def _memory() -> str:
    traced, peak = tracemalloc.get_traced_memory()
    rss = rss_mb()
    return (f"{traced / 2**20:.1f} MB traced (peak since the last report {peak / 2**20:.1f} MB), RSS "
            + ("unknown" if rss is None else f"{rss:.1f} MB"))


def _groups(snapshot: tracemalloc.Snapshot) -> tracemalloc.Snapshot:
    # The import machinery, tracemalloc's bookkeeping and the source lines a report reads are not the service's.
    return snapshot.filter_traces((tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
                                   tracemalloc.Filter(False, "<frozen importlib._bootstrap_external>"),
                                   tracemalloc.Filter(False, tracemalloc.__file__),
                                   tracemalloc.Filter(False, linecache.__file__),
                                   tracemalloc.Filter(False, "<unknown>")))


class HeapDiff:
    """Snapshots on request, each compared with the one before."""

    def __init__(self) -> None:
        self.previous: tracemalloc.Snapshot | None = None
        self.running: asyncio.Task[None] | None = None

    def requested(self) -> None:
        if self.running is None or self.running.done():
            self.running = asyncio.get_running_loop().create_task(self.report())

    async def report(self) -> None:
        snapshot = _groups(await asyncio.to_thread(tracemalloc.take_snapshot))  # seconds on a big heap: off the loop
        if self.previous is None:
            lines = [f"{stat}" for stat in snapshot.statistics("lineno")[:TOP]]
            log.warning("heap: %s; largest holders:\n%s", _memory(), "\n".join(lines))
        else:
            diffs = await asyncio.to_thread(snapshot.compare_to, self.previous, "traceback")
            grown = [diff for diff in diffs if diff.size_diff > 0][:TOP]
            lines = [f"{diff.size_diff / 1024:+.1f} KiB {diff.count_diff:+d} blocks (now {diff.size / 1024:.1f} KiB)"
                     f"\n    " + "\n    ".join(diff.traceback.format(limit=FRAMES, most_recent_first=True))
                     for diff in grown]
            total = sum(d.size_diff for d in diffs)
            log.warning("heap: %s, %+.1f KiB traced since the last snapshot; grown most:\n%s", _memory(),
                        total / 1024, "\n".join(lines))
        self.previous = snapshot
        tracemalloc.reset_peak()  # the next report's peak is its own period's: the most the allocator was asked for


def install_heap_diff() -> HeapDiff | None:
    """With `SHESHNAG_TRACEMALLOC=1`: start tracing and answer SIGUSR2 with a heap report in the log."""
    if os.environ.get(ENV) != "1":
        return None
    tracemalloc.start(FRAMES)
    heap = HeapDiff()
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, heap.requested)
    log.warning("tracing allocations (%s=1): send SIGUSR2 for a heap report", ENV)
    return heap
