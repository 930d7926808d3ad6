"""`sheshnag status`: the fleet, the queue and why it waits, held batches, running batches with progress and ETA,
consumer lag, free space per volume."""

import asyncio
import json
import sys
import time

from nats.js.kv import KeyValue

from infra.account_tools import connected
from services.gateway.background.batch_census import BatchCensus, Counts
from services.gateway.background.fleet_gauges import CENSUS_READY_S
from services.gateway.usecases.overview import Overview, gather
from services.runtime.nats.fleet import Fleet
from services.runtime.process.settings import ConnectionSettings
from services.runtime.process.tasks import cancel_and_join
from services.runtime.storage.volumes import measure

BAR_WIDTH = 24


async def counted_once(kv: KeyValue, wait_s: float = CENSUS_READY_S) -> Counts:
    """Every batch's current record counted once; after `wait_s`, what was counted so far (a first count is kept
    aside until complete, and dropped when its watch stops, so it is taken before)."""
    census = BatchCensus()
    counting = asyncio.create_task(census.follow(kv))
    partial: Counts | None = None
    try:
        await asyncio.wait_for(census.ready.wait(), wait_s)
    except TimeoutError:
        partial = census.counting
        print(f"(the batches were not all counted within {wait_s:.0f} s: what was counted is shown)",
              file=sys.stderr)
    finally:
        await cancel_and_join([counting])  # a single cancel may be lost on 3.11 (tasks.py): again until it ends
    return census if census.ready.is_set() or partial is None else partial


async def status(as_json: bool) -> None:
    async with connected("sheshnag-status") as (bus, read_model):
        census = await counted_once(read_model.kv)
        view = await gather(bus, read_model, await Fleet.open(bus), census)
        view.volumes = await measure(ConnectionSettings(), bus.js)
    print(json.dumps(view.as_dict(), indent=2) if as_json else render(view))


def bar(done: int, total: int) -> str:
    filled = BAR_WIDTH * done // total if total else 0
    return "[" + "#" * filled + "." * (BAR_WIDTH - filled) + "]"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def render(view: Overview) -> str:
    out = [f"Sheshnag at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(view.at))}"
           f"   stream head {view.stream_last_seq}",
           "", f"Fleet ({len(view.executors)} executor{'s' if len(view.executors) != 1 else ''})"]
    for e in view.executors:
        health = "ok" if e.heartbeat_age_s < 10 else f"stale {e.heartbeat_age_s:.0f}s"
        out.append(f"  {e.executor_id:<16} {e.engine:<12} slots {e.slots:<3} free {e.free_bytes / 2**30:6.1f} GiB "
                   f"of {e.total_bytes / 2**30:.1f}  {health:<10} {', '.join(e.models)}")
    counts = "  ".join(f"{status} {n}" for status, n in sorted(view.batches_by_status.items()))
    out += ["", f"Batches  {counts or 'none'}", "", f"Queue ({len(view.queued)} validated, waiting)"]
    for q in sorted(view.queued, key=lambda q: -q.age_s):
        out.append(f"  {q.batch_id:<32} {q.model:<28} waiting {_duration(q.age_s):<8} {q.reason}")
    out += ["", f"Held ({len(view.held)} validated, waiting for their owner's release)"]
    for h in sorted(view.held, key=lambda h: -h.age_s):
        out.append(f"  {h.batch_id:<32} {h.model:<28} held {_duration(h.age_s)}")
    out += ["", f"Running ({len(view.running)})"]
    for r in view.running:
        out.append(f"  {r.batch_id:<32} {r.status:<11} {bar(r.done, r.total)} {r.done}/{r.total} "
                   f"{r.lines_per_s:.2f} lines/s  ETA {_duration(r.eta_s)}")
    out += ["", "Storage (free / reserve)" + ("" if view.volumes else ": no volume watched (SHESHNAG_STORAGE_PATHS)")]
    for v in view.volumes:
        out.append(f"  {v.name:<14} {v.free_bytes / 2**20:10.1f} MiB free of {v.total_bytes / 2**20:.1f}  reserve "
                   f"{v.reserve_bytes / 2**20:.1f} MiB  {v.level:<9} {v.path}")
    out += ["", "Consumers (pending / unacked)"]
    for c in view.consumers:
        kind = "durable" if c.durable else "ephemeral"
        out.append(f"  {c.stream:<7} {c.name:<28} {kind:<9} {c.pending:>7} / {c.ack_pending}")
    return "\n".join(out)
