"""One look at the whole system from NATS: fleet, queue, held and running batches, each owner's share, consumer lag
(a batch held with `hold: true` waits for its owner, never counted as queued). Used by the fleet-wide gauges and by
`sheshnag status`."""

import asyncio
import time
from dataclasses import asdict, dataclass, field

from contracts.events.executor import EngineName, ExecutorAdvert
from contracts.lifecycle import IN_FLIGHT
from contracts.readmodel import BatchRecord
from contracts.subjects import EVENTS_STREAM, WORK_STREAM
from services.gateway.background.batch_census import Counts
from services.gateway.usecases.shares import SHARE_WINDOW_S, OwnerShare, owner_shares
from services.runtime.nats.bus import EventBus
from services.runtime.nats.fleet import Fleet
from services.runtime.nats.readmodel import ReadModel
from services.runtime.process import metrics
from services.runtime.storage.volumes import VolumeSpace


@dataclass(frozen=True)
class ExecutorView:
    executor_id: str
    engine: EngineName
    models: list[str]
    slots: int
    free_bytes: int
    total_bytes: int
    heartbeat_age_s: float


@dataclass(frozen=True)
class QueuedBatch:
    batch_id: str
    model: str
    age_s: float
    reason: str


@dataclass(frozen=True)
class RunningBatch:
    batch_id: str
    model: str
    status: str
    done: int
    total: int
    lines_per_s: float
    eta_s: float | None


@dataclass(frozen=True)
class ConsumerLag:
    stream: str
    name: str
    durable: bool
    pending: int
    ack_pending: int


@dataclass
class Overview:
    at: float
    executors: list[ExecutorView] = field(default_factory=list)
    batches_by_status: dict[str, int] = field(default_factory=dict)
    queued: list[QueuedBatch] = field(default_factory=list)
    """Validated batches waiting for an executor."""
    held: list[QueuedBatch] = field(default_factory=list)
    """Validated batches held by their owner (`hold: true`) until `POST /v1/batches/{id}/release`."""
    running: list[RunningBatch] = field(default_factory=list)
    owners: list[OwnerShare] = field(default_factory=list)
    """Each owner's share of the lines the fleet committed in the last `share_window_s`, the largest first."""
    share_window_s: float = SHARE_WINDOW_S
    consumers: list[ConsumerLag] = field(default_factory=list)
    stream_last_seq: int = 0
    volumes: list[VolumeSpace] = field(default_factory=list)
    """Free space of each watched volume against its reserve, with its level."""
    counted: bool = True
    """Whether every batch was counted (False: a gateway still making its first count shows what it has so far)."""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def executor_view(advert: ExecutorAdvert, now: float) -> ExecutorView:
    return ExecutorView(advert.executor_id, advert.engine, advert.models, advert.slots,
                        sum(d.free_bytes for d in advert.devices), sum(d.total_bytes for d in advert.devices),
                        round(max(now - advert.heartbeat_at / 1000, 0.0), 1))


def running_view(record: BatchRecord, now: float) -> RunningBatch:
    batch = record.batch
    counts = batch.request_counts
    done = counts.completed + counts.failed
    elapsed = now - (batch.in_progress_at or batch.created_at)
    rate = done / elapsed if elapsed > 0 else 0.0
    eta = (counts.total - done) / rate if rate > 0 else None
    return RunningBatch(batch.id, batch.model or "", batch.status, done, counts.total, round(rate, 2),
                        None if eta is None else round(eta, 1))


async def consumer_lags(bus: EventBus) -> list[ConsumerLag]:
    return [ConsumerLag(stream, info.name, bool(info.config.durable_name), info.num_pending or 0,
                        info.num_ack_pending or 0)
            for stream in (EVENTS_STREAM, WORK_STREAM) for info in await bus.js.consumers_info(stream)]


def tally(view: Overview, record: BatchRecord, now: float) -> None:
    """Count one batch record into the view: its status, and the queue, the held or the running batches."""
    batch = record.batch
    view.batches_by_status[batch.status] = view.batches_by_status.get(batch.status, 0) + 1
    if batch.status == "validated":
        waiting = QueuedBatch(batch.id, batch.model or "", round(now - batch.created_at, 1), batch.status_reason or "")
        (view.held if batch.held else view.queued).append(waiting)
    elif batch.status in IN_FLIGHT:  # a cancelling batch's attempts still run until they stop
        view.running.append(running_view(record, now))


def census_view(census: Counts, adverts: list[ExecutorAdvert], now: float) -> Overview:
    """The fleet and the batches as the census counts them: per status, and the queued, held and running ones."""
    view = Overview(at=now)
    view.executors = [executor_view(advert, now) for advert in adverts]
    for record in list(census.open.values()):
        tally(view, record, now)
    view.batches_by_status = census.by_status()
    return view


async def gather(bus: EventBus, read_model: ReadModel, fleet: Fleet, census: Counts) -> Overview:
    """The whole look, from the batch census (its unfinished batches, its counts and the runs that ended in the share
    window): no batch record is read, and of the users only those with a share."""
    now = time.time()
    view = census_view(census, await fleet.adverts(), now)
    records, ended = list(census.open.values()), census.runs_ended_within(now)
    user_ids = {record.owner_user_id for record in records} | {span.user_id for span in ended}
    users = await asyncio.gather(*(read_model.get_user(user_id) for user_id in user_ids if user_id is not None))
    organizations = {user.user_id: user.organization_id for user in users if user is not None}
    view.owners = owner_shares(records, organizations, now, ended=ended)
    view.consumers = await consumer_lags(bus)
    view.stream_last_seq = (await bus.js.stream_info(EVENTS_STREAM)).state.last_seq
    return view


def export_gauges(view: Overview) -> None:
    """Set the fleet-wide gauges from one overview (by the gateway's refresher, not by a scrape)."""
    metrics.EXECUTORS.set(len(view.executors))
    metrics.BATCHES.clear()
    for status, count in view.batches_by_status.items():
        metrics.BATCHES.labels(status).set(count)
    metrics.QUEUE_DEPTH.clear()
    metrics.QUEUE_AGE.clear()
    oldest: dict[str, float] = {}
    for queued in view.queued:
        metrics.QUEUE_DEPTH.labels(queued.model).inc()
        oldest[queued.model] = max(oldest.get(queued.model, 0.0), queued.age_s)
    for model, age_s in oldest.items():
        metrics.QUEUE_AGE.labels(model).set(age_s)
    metrics.HELD.clear()
    for held in view.held:
        metrics.HELD.labels(held.model).inc()
    metrics.CONSUMER_LAG.clear()
    metrics.CONSUMER_UNACKED.clear()
    for consumer in view.consumers:
        if consumer.durable:
            metrics.CONSUMER_LAG.labels(consumer.stream, consumer.name).set(consumer.pending)
            metrics.CONSUMER_UNACKED.labels(consumer.stream, consumer.name).set(consumer.ack_pending)
