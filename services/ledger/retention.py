"""The ledger's retention (leader only): once a period, archive the facts folded since the last point as a segment,
checked and committed by a snapshot of the ledger's state, then purge the batches ended longer than the window ago.
No fact leaves before its segment is committed (a crash before that has it written again); purges are idempotent."""

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import cast

from contracts.archive import ARCHIVED_THROUGH_KEY, ArchivedThrough, fact_line
from contracts.lifecycle import TERMINAL
from contracts.subjects import EVENTS_STREAM, batch_events, parse_event_subject
from services.ledger.application import Ledger
from services.ledger.archive import Archive, ArchivePoint, SegmentEnd, SegmentHeader, groups
from services.ledger.chain import DIGEST_CHARS, Fact, link, link_run
from services.ledger.domainmodel import Batch
from services.ledger.snapshot import Refold
from services.runtime.nats import eventlog
from services.runtime.nats.bus import EventBus
from services.runtime.nats.readmodel import ReadModel

log = logging.getLogger(__name__)

GROUP = 5000
"""Facts refolded per step (in a worker thread)."""
PURGES_AT_ONCE = 8
CHECK_S = 60.0
"""How often the worker looks whether a round is due (and finishes a crashed round's purge)."""


class ArchiveRefused(RuntimeError):
    """A segment did not read back as written, or does not chain as the ledger folded it: nothing is committed."""


@dataclass(frozen=True)
class Policy:
    window_s: float
    """An ended batch's facts stay in the stream this long after it ended."""
    period_s: float
    """A segment is cut this often."""


class Retention:
    def __init__(self, bus: EventBus, read_model: ReadModel, archive: Archive, ledger: Ledger, policy: Policy,
                 clock: Callable[[], float] = time.time) -> None:
        self.bus, self.read_model, self.archive, self.ledger = bus, read_model, archive, ledger
        self.policy, self.clock = policy, clock
        self._purged = 0
        """The newest point whose purge this process finished (a restart does the last one again, harmlessly)."""

    async def run(self, stop: asyncio.Event) -> None:
        """Rounds as they fall due, until `stop`; a failed round is logged and tried again at the next check."""
        while not stop.is_set():
            try:
                await self.round()
            except Exception:
                log.exception("ledger retention round failed; it is tried again in %.0f s", CHECK_S)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=max(1.0, min(CHECK_S, self.policy.period_s)))

    async def round(self) -> ArchivePoint | None:
        """Finish the last round's purge; archive through the checkpoint once a period has passed (at once at first)."""
        latest = await self.archive.latest_point()
        if latest is not None and latest.index > self._purged:
            await self.purge(latest)
        if latest is not None and self.clock() - latest.archived_at < self.policy.period_s:
            return None
        return await self.archive_through(await asyncio.to_thread(self.ledger.checkpoint), latest)

    async def archive_through(self, point: int, latest: ArchivePoint | None) -> ArchivePoint | None:
        """One round: the facts after `latest` up to `point` as a segment, checked, committed by a snapshot, purged."""
        after = latest.last_sequence if latest else 0
        if point <= after:
            return None
        header = SegmentHeader(index=(latest.index if latest else 0) + 1, first_sequence=after + 1,
                               last_sequence=point, previous_sha256=latest.segment_sha256 if latest else "",
                               chain_before=latest.chain_head if latest else "")
        written_sha256, end, batches = await self._write_segment(header)
        _, anomalies, previous = await self.archive.snapshot(latest.index) if latest else (None, [], [])
        refold = await asyncio.to_thread(Refold, previous, after)
        try:
            await self._refold_segment(header, written_sha256, end, refold)
            purge, kept = await asyncio.to_thread(self._decide, refold, sorted({*(latest.kept if latest else []),
                                                                                 *batches}), point)
            snapshots = await asyncio.to_thread(refold.snapshots)
            committed = ArchivePoint(index=header.index, last_sequence=point, chain_head=end.chain_after,
                                     segment_sha256=written_sha256, archived_at=int(self.clock()), purge=purge,
                                     kept=kept, aggregates=len(snapshots))
            await self.archive.write_snapshot(committed, [*anomalies, *refold.anomalies], snapshots)
            if await self.archive.point(committed.index) != committed:  # a deposed leader's round raced this one
                raise ArchiveRefused(f"snapshot {committed.index} was committed by another ledger")
        finally:
            await asyncio.to_thread(refold.close)
        log.info("archived sequences %d..%d as segment %d (%d facts); %d batches leave the stream, %d stay",
                 after + 1, point, header.index, end.facts, len(purge), len(kept))
        await self.purge(committed)
        await self.archive.prune_snapshots(keep_from=committed.index - 1)  # the one before stays, for a while
        return committed

    async def _write_segment(self, header: SegmentHeader) -> tuple[str, SegmentEnd, set[str]]:
        head, facts, batches = header.chain_before, 0, set()
        log_facts = cast(AsyncGenerator[Fact, None], eventlog.read(self.bus, after=header.first_sequence - 1))
        async with self.archive.segment_writer(header.index) as writer, contextlib.aclosing(log_facts):
            await writer.write(header.model_dump_json().encode() + b"\n")
            async for fact in log_facts:
                if fact.sequence > header.last_sequence:
                    break
                head = link(head, fact)
                facts += 1
                subject = parse_event_subject(fact.subject)
                if subject is not None and subject.kind == "batch":
                    batches.add(subject.aggregate_id)
                await writer.write(fact_line(fact.sequence, fact.subject, fact.data))
            end = SegmentEnd(facts=facts, chain_after=head)
            await writer.write(end.model_dump_json().encode() + b"\n")
            return await writer.finish(), end, batches

    async def _refold_segment(self, header: SegmentHeader, sha256: str, end: SegmentEnd, refold: Refold) -> None:
        """Read the segment back and fold it onto the point before: it must hash and chain as written, and end
        where the live ledger's chain is at its last fact."""
        segment, head, last = self.archive.segment(header.index), header.chain_before, 0

        def judge(read: SegmentHeader) -> None:
            if read != header:
                raise ArchiveRefused(f"segment {header.index} reads back with another header")

        async for group in groups(segment.facts(judge), GROUP):
            head, last = link_run(head, group)[1], group[-1].sequence
            await asyncio.to_thread(refold.fold, group)
        if segment.header != header or segment.sha256 != sha256 or segment.end != end or head != end.chain_after:
            raise ArchiveRefused(f"segment {header.index} does not read back as it was written")
        chained_through, chain_head = await asyncio.to_thread(refold.ledger.chain_state)
        if last and (chained_through != last or chain_head != head):
            raise ArchiveRefused(f"segment {header.index} does not fold to its own chain")
        live = await asyncio.to_thread(self.ledger.chain_digest_at, last) if last else None
        if live is not None and live != head[:DIGEST_CHARS]:
            raise ArchiveRefused(f"segment {header.index}'s chain differs from the ledger's at sequence {last}")

    def _decide(self, refold: Refold, candidates: list[str], point: int) -> tuple[list[str], list[str]]:
        """Which batches with facts up to `point` leave the stream now: those ended more than the window ago."""
        purge, kept = [], []
        cutoff = self.clock() - self.policy.window_s
        for batch_id in candidates:
            batch = refold.ledger.batch(batch_id)
            if batch is None or (batch.status in TERMINAL and ended_at(batch) <= cutoff):
                purge.append(batch_id)  # None: facts of no batch the ledger knows (refused); nothing reads them
            else:
                kept.append(batch_id)
        return purge, kept

    async def purge(self, point: ArchivePoint) -> None:
        """Each batch of the point's purge list: its facts up to the point into its archived log, then out of the
        stream (idempotent). The read model says first that the stream is trimmed, so a ledger started on an empty
        store restores the point rather than fold what is left of the stream."""
        await self.read_model.put(ARCHIVED_THROUGH_KEY, ArchivedThrough(index=point.index,
                                                                        last_sequence=point.last_sequence))
        gate = asyncio.Semaphore(PURGES_AT_ONCE)

        async def one(batch_id: str) -> None:
            async with gate:
                await purge_batch(self.bus, self.archive, batch_id, point.last_sequence)

        await asyncio.gather(*(one(batch_id) for batch_id in point.purge))
        self._purged = max(self._purged, point.index)


async def purge_batch(bus: EventBus, archive: Archive, batch_id: str, upto: int) -> bool:
    """A batch's facts up to `upto` into its archived log (read back), then out of the stream. Idempotent; False
    when the stream had none left."""
    subject = batch_events(batch_id)
    in_stream = [fact async for fact in eventlog.read(bus, subject) if fact.sequence <= upto]
    if not in_stream:
        return False
    # A fact may come long after its batch ended (and was purged before): its log keeps all of them.
    merged = {fact.sequence: fact for fact in await archive.batch_log(batch_id)}
    merged.update((fact.sequence, Fact(fact.sequence, fact.subject, fact.data)) for fact in in_stream)
    facts = [merged[sequence] for sequence in sorted(merged)]
    await archive.write_batch_log(batch_id, facts)
    if await archive.batch_log(batch_id) != facts:
        raise ArchiveRefused(f"the archived log of {batch_id} does not read back as written")
    await bus.js.purge_stream(EVENTS_STREAM, subject=subject, seq=upto + 1)
    return True


def ended_at(batch: Batch) -> float:
    """When the batch ended (epoch seconds), as its end fact said."""
    times = batch.times
    return times.get(f"{batch.status}_at") or max(times.values(), default=batch.created_at)
