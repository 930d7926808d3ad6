"""What one scheduler tick (`decide`, a pure function of the book and the fleet) costs as open batches pile up: CPU ms
per tick with every executor place taken (a tick only does upkeep) and with a free place (it also hands out a unit,
which builds the fair queue over every batch waiting). A tick comes after every nudging fact (at most every 20 ms)
and every `tick_s`, so its cost bounds how many units a scheduler can hand out per second.

Baseline in the same run: the smallest book (100 batches). CPU seconds from `time.process_time`, steadier than
wall time on a shared machine.

Usage: .venv/bin/python -m bench.scheduler_tick [--sizes 100,1000,5000,20000] [--owners 50] [--ticks 5]
"""

import argparse
import gc
import time

from contracts.catalogue import Catalogue, CatalogueModel
from contracts.events.batch import BatchAssigned, BatchValidated
from contracts.events.executor import DeviceMemory, ExecutorAdvert
from services.scheduler.actions import Assign, Policy
from services.scheduler.book import Book
from services.scheduler.decisions import decide
from tests.factories import batch_created

NOW_MS = 2_000_000_000_000
MODEL = "m"
CATALOGUE = Catalogue(models=[CatalogueModel(id=MODEL, engine="llamacpp", artifact="/m.gguf", context_length=2048,
                                             memory_bytes=1000, endpoints=["/v1/chat/completions"])])
POLICY = Policy(max_queued_lines=10**12)


def advert(executor_id: str, parallel: int) -> ExecutorAdvert:
    return ExecutorAdvert(executor_id=executor_id, engine="llamacpp", engine_version="1", models=[MODEL],
                          loaded_models=[MODEL], slots=8, heartbeat_at=NOW_MS, parallel_attempts=parallel,
                          devices=[DeviceMemory(name="cpu", total_bytes=10**10, free_bytes=10**10)])


def book_of(batches: int, owners: int) -> Book:
    """`batches` validated 3-line batches of `owners` owners, none running yet."""
    book = Book(admitted={"e1"}, known_executors={"e1": NOW_MS})
    for n in range(batches):
        batch_id = f"batch_{n}"
        book.apply(batch_created(batch_id, f"key_{n % owners}", f"files/file-{n}", created_at=0,
                                 expires_at=NOW_MS // 1000 + 86_400))
        book.apply(BatchValidated(aggregate_id=batch_id, total_lines=3, model=MODEL))
    return book


def fill(book: Book, fleet: list[ExecutorAdvert]) -> None:
    """Hand out every place once (as the log would state it), so later ticks find them taken."""
    for action in decide(book, fleet, CATALOGUE, NOW_MS, POLICY):
        if isinstance(action, Assign):
            book.apply(BatchAssigned(aggregate_id=action.plan.batch_id, executor_id=action.executor_id,
                                     attempt=action.attempt, lease_token="t", shard=action.shard,
                                     shards=action.layout.shards, shard_span=action.layout.span, occurred_at=NOW_MS))


def ms_per_tick(book: Book, fleet: list[ExecutorAdvert], ticks: int) -> float:
    gc.collect()  # the garbage of the books made before is not this book's cost
    started = time.process_time()
    for _ in range(ticks):
        decide(book, fleet, CATALOGUE, NOW_MS, POLICY)
    return (time.process_time() - started) / ticks * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000,5000,20000")
    parser.add_argument("--owners", type=int, default=50)
    parser.add_argument("--ticks", type=int, default=5)
    args = parser.parse_args()
    rows = []
    for size in [int(size) for size in args.sizes.split(",")]:
        book = book_of(size, args.owners)
        busy = [advert("e1", parallel=8)]
        fill(book, busy)
        taken = ms_per_tick(book, busy, args.ticks)
        free = ms_per_tick(book, [advert("e1", parallel=9)], args.ticks)  # one place more than it holds
        rows.append((size, taken, free))
    base_taken, base_free = rows[0][1], rows[0][2]
    print(f"\nScheduler tick cost ({args.owners} owners, one executor of 8 places; CPU ms per tick, mean of "
          f"{args.ticks})\n")
    print("| open batches | every place taken | x baseline | a free place | x baseline | units/s at most |")
    print("|---|---|---|---|---|---|")
    for size, taken, free in rows:
        print(f"| {size} | {taken:.1f} | {taken / base_taken:.1f} | {free:.1f} | {free / base_free:.1f} | "
              f"{1000 / free:.0f} |")


if __name__ == "__main__":
    main()
