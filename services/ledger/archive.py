"""The ledger's archive in the object store, gzipped in bounded memory: a hash-chained segment of the log per period,
the snapshot that commits it (pinning its hash: no segment changes unseen; one without its snapshot is written again),
and the logs of batches purged from the stream."""

import asyncio
import contextlib
import hashlib
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

import orjson
from pydantic import BaseModel

from contracts.archive import (
    SNAPSHOTS_PREFIX,
    archived_batch_log_key,
    fact_line,
    index_of,
    parse_fact_line,
    segment_key,
    snapshot_key,
)
from contracts.readmodel import AnomalyRecord
from services.ledger.chain import Fact, link
from services.runtime.storage.objectstore import ObjectNotFound, ObjectStore, StreamingUpload

GZIP = 31
"""zlib's window bits for the gzip format (any `gunzip` reads an archive object)."""
COMPRESS_BYTES = 1 << 20
"""Bytes gathered before they are compressed (in a worker thread, off the event loop)."""


class SegmentHeader(BaseModel):
    """A segment's first line: which facts it holds and what comes before them."""

    index: int
    first_sequence: int
    last_sequence: int
    """Every fact of the stream with a sequence in [first_sequence, last_sequence] is in the segment."""
    previous_sha256: str
    """The SHA-256 of segment `index - 1`'s object ("" for the first)."""
    chain_before: str
    """The EVENTS hash chain's head before the segment's first fact ("" for the first)."""


class SegmentEnd(BaseModel):
    """A segment's last line."""

    facts: int
    chain_after: str
    """The hash chain's head after the segment's last fact."""


class ArchivePoint(BaseModel):
    """A snapshot's first line: the archived point it commits, and what the round purges from the stream."""

    index: int
    last_sequence: int
    """The snapshot is the ledger's state after folding every fact up to here (segments 1..index hold them)."""
    chain_head: str
    segment_sha256: str
    """The SHA-256 of segment `index`'s object."""
    archived_at: int
    """When the round ran (epoch seconds)."""
    purge: list[str]
    """Batches ended before their retention window whose facts (up to `last_sequence`) leave the stream."""
    kept: list[str]
    """Batches with facts up to `last_sequence` still in the stream after this round (open, or within the window)."""
    aggregates: int


class ArchiveBroken(Exception):
    """A segment does not chain to the one before it, to its own recorded ends, or to the point that commits it."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(f"segment {index}: {reason}")


class GzipWriter:
    """Lines into a gzipped object, hashed as sent. Used as `async with`: a write that fails (the stream, the store,
    a cancel) aborts the upload, so no incomplete multipart upload is left behind."""

    def __init__(self, upload: StreamingUpload) -> None:
        self.upload = upload
        self._zlib = zlib.compressobj(6, zlib.DEFLATED, GZIP)
        self._pending = bytearray()
        self._sha256 = hashlib.sha256()

    async def __aenter__(self) -> "GzipWriter":
        return self

    async def __aexit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is not None:
            await asyncio.shield(self.upload.abort())

    async def write(self, data: bytes) -> None:
        self._pending += data
        if len(self._pending) >= COMPRESS_BYTES:
            pending, self._pending = bytes(self._pending), bytearray()
            await self._send(await asyncio.to_thread(self._zlib.compress, pending))

    async def finish(self) -> str:
        """Send the rest and make the object visible; its SHA-256."""
        pending = bytes(self._pending)
        await self._send(await asyncio.to_thread(lambda: self._zlib.compress(pending) + self._zlib.flush()))
        await self.upload.finish()
        return self._sha256.hexdigest()

    async def _send(self, data: bytes) -> None:
        if data:
            self._sha256.update(data)
            await self.upload.write(data)


class GzipReader:
    """The lines of a gzipped object; once read to its end, `sha256` is the object's hash."""

    def __init__(self, store: ObjectStore, key: str) -> None:
        self.store, self.key = store, key
        self.sha256 = ""

    async def lines(self) -> AsyncGenerator[bytes, None]:
        unzip = zlib.decompressobj(GZIP)
        digest = hashlib.sha256()
        pending = b""
        async with contextlib.aclosing(self.store.iter_chunks(self.key)) as chunks:
            async for chunk in chunks:
                digest.update(chunk)
                *lines, pending = (pending + unzip.decompress(chunk)).split(b"\n")
                for line in lines:
                    yield line
        pending += unzip.flush()
        if pending:
            yield pending
        if not unzip.eof:
            raise ValueError(f"{self.key} ends before its gzip stream does")
        self.sha256 = digest.hexdigest()


class SegmentReader(GzipReader):
    """A segment's facts in stream order; its header once its first line is read, its end and hash once all is."""

    def __init__(self, store: ObjectStore, index: int) -> None:
        super().__init__(store, segment_key(index))
        self.header: SegmentHeader | None = None
        self.end: SegmentEnd | None = None

    async def facts(self, judge: Callable[[SegmentHeader], None] | None = None) -> AsyncIterator[Fact]:
        """The segment's facts; `judge` sees its header first, before any fact is handed on (and may raise)."""
        async for line in self.lines():
            if self.header is None:
                self.header = SegmentHeader.model_validate_json(line)
                if judge is not None:
                    judge(self.header)
            elif line.startswith(b'{"facts"'):
                self.end = SegmentEnd.model_validate_json(line)
            elif line:
                yield Fact(*parse_fact_line(line))


async def groups(facts: AsyncIterator[Fact], size: int) -> AsyncIterator[list[Fact]]:
    """Facts in lists of `size` (the last one shorter), to fold a list at a time."""
    group: list[Fact] = []
    async for fact in facts:
        group.append(fact)
        if len(group) >= size:
            yield group
            group = []
    if group:
        yield group


class Archive:
    """The archive's objects in one store."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    async def latest_point(self) -> ArchivePoint | None:
        """The newest committed point (its snapshot exists); None: nothing archived yet."""
        index = max((index_of(key) for key in await self.store.list_keys(SNAPSHOTS_PREFIX)), default=0)
        return await self.point(index) if index else None

    async def point(self, index: int) -> ArchivePoint:
        reader = GzipReader(self.store, snapshot_key(index))
        async with contextlib.aclosing(reader.lines()) as lines:
            async for line in lines:
                return ArchivePoint.model_validate_json(line)
        raise ValueError(f"snapshot {index} is empty")

    # Segments

    def segment_writer(self, index: int) -> GzipWriter:
        return GzipWriter(self.store.writer(segment_key(index), "application/gzip"))

    def segment(self, index: int) -> "SegmentReader":
        return SegmentReader(self.store, index)

    async def facts(self, upto: int, after: int = 0) -> AsyncIterator[Fact]:
        """Every archived fact after `after`, from the committed segments 1..`upto`, in stream order."""
        for index in range(1, upto + 1):
            async for fact in self.segment(index).facts():
                if fact.sequence > after:
                    yield fact

    async def verified_facts(self, point: ArchivePoint) -> AsyncIterator[Fact]:
        """Every archived fact up to the point, each segment checked once read (`ArchiveBroken` at the first that is
        not as the one before, the chain and the point say)."""
        previous_sha256, head = "", ""
        for index in range(1, point.index + 1):
            segment = self.segment(index)

            def judge(header: SegmentHeader, index: int = index, previous: str = previous_sha256,
                      before: str = head) -> None:
                if header.index != index or header.previous_sha256 != previous:
                    raise ArchiveBroken(index, "it does not name the hash of the segment before it")
                if header.chain_before != before:
                    raise ArchiveBroken(index, "it does not begin where the chain stood")

            async for fact in segment.facts(judge):
                head = link(head, fact)
                yield fact
            end = segment.end
            if segment.header is None or end is None:
                raise ArchiveBroken(index, "it is cut short")
            if end.chain_after != head:
                raise ArchiveBroken(index, "its facts do not chain to its recorded end")
            previous_sha256 = segment.sha256
        if previous_sha256 != point.segment_sha256 or head != point.chain_head:
            raise ArchiveBroken(point.index, "it is not the segment its snapshot committed")

    # Snapshots

    async def write_snapshot(self, point: ArchivePoint, anomalies: list[AnomalyRecord],
                             snapshots: list[dict[str, Any]]) -> None:
        """Commit a point: its header, the anomalies folded up to it, then each aggregate's snapshot."""
        async with GzipWriter(self.store.writer(snapshot_key(point.index), "application/gzip")) as writer:
            await writer.write(point.model_dump_json().encode() + b"\n")
            await writer.write(orjson.dumps([a.model_dump(mode="json") for a in anomalies]) + b"\n")
            for snapshot in snapshots:
                await writer.write(orjson.dumps(snapshot) + b"\n")
            await writer.finish()

    async def prune_snapshots(self, keep_from: int) -> None:
        """Remove the snapshots before index `keep_from` (replays start from the newest; `--full` and verify need
        only the segments and the newest snapshot's header)."""
        old = [key for key in await self.store.list_keys(SNAPSHOTS_PREFIX) if index_of(key) < keep_from]
        for key in old:
            await self.store.remove(key)

    async def snapshot(self, index: int) -> tuple[ArchivePoint, list[AnomalyRecord], list[dict[str, Any]]]:
        reader = GzipReader(self.store, snapshot_key(index))
        lines = [line async for line in reader.lines() if line]
        point = ArchivePoint.model_validate_json(lines[0])
        anomalies = [AnomalyRecord.model_validate(a) for a in orjson.loads(lines[1])]
        return point, anomalies, [orjson.loads(line) for line in lines[2:]]

    # Archived batches' logs

    async def batch_log(self, batch_id: str) -> list[Fact]:
        """An archived batch's facts in stream order; empty when none were archived."""
        try:
            reader = GzipReader(self.store, archived_batch_log_key(batch_id))
            return [Fact(*parse_fact_line(line)) async for line in reader.lines() if line]
        except ObjectNotFound:
            return []

    async def write_batch_log(self, batch_id: str, facts: list[Fact]) -> None:
        async with GzipWriter(self.store.writer(archived_batch_log_key(batch_id), "application/gzip")) as writer:
            for fact in facts:
                await writer.write(fact_line(fact.sequence, fact.subject, fact.data))
            await writer.finish()
