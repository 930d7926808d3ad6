"""Retention against a real broker and S3: ended batches' facts leave the stream once archived, and the history
replayed from the archive (snapshot + stream, or every segment + stream) is the history replayed whole."""

import asyncio
import io
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import BaseModel

from contracts.archive import ARCHIVED_THROUGH_KEY, segment_key
from contracts.events.batch import BatchAssigned, BatchCompleted, BatchStarted
from contracts.events.envelope import Event
from contracts.subjects import batch_events
from services.ledger import operator
from services.ledger.app import LedgerApp
from services.ledger.archive import Archive, ArchiveBroken, ArchivePoint, GzipReader, SegmentHeader
from services.ledger.replay import diff_against_live, replay_into_scratch
from services.ledger.retention import Policy, Retention
from services.ledger.settings import LedgerSettings
from services.runtime.nats import eventlog
from services.runtime.nats.bus import EventBus
from services.runtime.nats.readmodel import ReadModel
from services.runtime.process.settings import ConnectionSettings
from services.runtime.storage.objectstore import ObjectStore
from tests.conftest import RunningNats, RunningS3
from tests.factories import batch_created
from tests.integration.test_ledger_rebuild import BAD, GOOD, folded_through, history, running_ledger
from tests.unit.ledger.test_ledger_billing import BATCH, chunk, created, grant, reserved, running, usage

OPEN = "batch_open"
"""A billed batch still running when the history is archived: its facts must stay in the stream."""
HOUR = 3600.0
NOW = time.time()


def opened(batch_id: str) -> list[Event]:
    return [reserved(1_000_000, batch_id), created(batch_id), *running(batch_id)[:1],
            BatchAssigned(aggregate_id=batch_id, executor_id="exec-1", attempt=1, lease_token="t"),
            running(batch_id)[1]]


def before() -> list[Event]:
    """Archived in the first round: two batches that ended long ago (one refused a start after it failed: an
    anomaly), a billed batch that ended just now, and a billed batch that runs on."""
    return [*history(), BatchStarted(aggregate_id=BAD, executor_id="exec-1", attempt=1, engine="llamacpp",
                                     engine_version="1"),
            grant("5"), reserved(2_000_000), created(), *running(), chunk(0, 2, usage(1000, 2000)),
            BatchCompleted(aggregate_id=BATCH, output_file_id="o", error_file_id=None, completed=2, failed=0,
                           usage=usage(1000, 2000)),
            *opened(OPEN), chunk(0, 1, usage(100, 200), OPEN)]


def after() -> list[Event]:
    """In the stream after the first archived point: the running batch goes on, credit and a new batch come."""
    return [chunk(1, 2, usage(10, 20), OPEN), grant("1", "g2"),
            batch_created("batch_late", "key_ab", f"files/file-{GOOD}", created_at=1, expires_at=2)]


@dataclass
class Stack:
    bus: EventBus
    read_model: ReadModel
    archive: Archive
    settings: LedgerSettings
    app: LedgerApp

    def retention(self, now: float = NOW) -> Retention:
        assert self.app.folder is not None
        return Retention(self.bus, self.read_model, self.archive, self.app.folder.ledger, Policy(HOUR, HOUR),
                         clock=lambda: now)


def own_bucket(fresh_nats: RunningNats, s3_server: RunningS3) -> ConnectionSettings:
    return ConnectionSettings(nats_url=fresh_nats.url, s3_endpoint=s3_server.endpoint,
                              s3_access_key=s3_server.credentials.access_key,
                              s3_secret_key=s3_server.credentials.secret_key,
                              s3_bucket=f"retention-{uuid.uuid4().hex[:12]}")


@pytest.fixture
async def stack(fresh_nats: RunningNats, s3_server: RunningS3, tmp_path: Path) -> AsyncIterator[Stack]:
    """A broker of the test's own whose stream holds `before()` then `after()`, a bucket of its own, and a live
    ledger that folded them all."""
    connection = own_bucket(fresh_nats, s3_server)
    store = ObjectStore.from_settings(connection)
    await store.ensure_bucket()
    bus = await EventBus.connect(fresh_nats.url, "tests")
    for fact in [*before(), *after()]:
        head = await bus.publish(fact)
    settings = LedgerSettings(connection=connection, db_path=tmp_path / "l.sqlite")
    try:
        async with running_ledger(fresh_nats.url, tmp_path / "l.sqlite", settings) as app:
            await folded_through(app, head)
            yield Stack(bus, await ReadModel.open(bus), Archive(store), settings, app)
    finally:
        await bus.close()
        store.close()


def dumped(records: dict[str, BaseModel]) -> dict[str, object]:
    return {key: record.model_dump() for key, record in records.items() if key != ARCHIVED_THROUGH_KEY}


async def in_stream(bus: EventBus, batch_id: str) -> list[int]:
    return [fact.sequence async for fact in eventlog.read(bus, batch_events(batch_id))]


async def test_a_history_replayed_from_the_archive_gives_the_read_models_and_hash_chain_of_the_whole_history(
    stack: Stack,
) -> None:
    whole = await replay_into_scratch(stack.bus)
    good_facts = await in_stream(stack.bus, GOOD)

    first = await stack.retention().archive_through(len(before()), None)
    assert first is not None and first.purge == sorted([GOOD, BAD])
    assert await in_stream(stack.bus, GOOD) == [] and await in_stream(stack.bus, BAD) == []

    for full in (False, True):
        replayed = await replay_into_scratch(stack.bus, archive=stack.archive, full=full)
        assert replayed.archived_through == len(before())
        assert dumped(replayed.records) == dumped(whole.records)
        assert replayed.chain_head == whole.chain_head
        assert await diff_against_live(stack.bus, stack.read_model, replayed) == []

    # Two hours on, the billed batch has left its window too; the other two have not ended.
    second = await stack.retention(NOW + 2 * HOUR).archive_through(len(before()) + len(after()), first)
    assert second is not None and second.purge == [BATCH] and second.kept == ["batch_late", OPEN]
    for full in (False, True):
        replayed = await replay_into_scratch(stack.bus, archive=stack.archive, full=full)
        assert dumped(replayed.records) == dumped(whole.records) and replayed.chain_head == whole.chain_head

    out = io.StringIO()
    assert await operator.verify(stack.settings, out) == 0, out.getvalue()
    assert f"verified {len(before()) + len(after())} events" in out.getvalue()
    out = io.StringIO()
    assert await operator.replay(stack.settings, out) == 0, out.getvalue()
    assert "from archived point" in out.getvalue() and "matches" in out.getvalue()

    audit = io.StringIO()
    assert await operator.audit(stack.settings, GOOD, True, audit) == 0
    assert [json.loads(line)["sequence"] for line in audit.getvalue().splitlines()] == good_facts


async def test_an_open_batch_and_one_within_its_window_keep_every_fact_in_the_stream(stack: Stack) -> None:
    open_facts, billed_facts = await in_stream(stack.bus, OPEN), await in_stream(stack.bus, BATCH)
    point = await stack.retention().archive_through(len(before()) + len(after()), None)
    assert point is not None and point.kept == sorted([BATCH, OPEN, "batch_late"])
    assert await in_stream(stack.bus, OPEN) == open_facts and await in_stream(stack.bus, BATCH) == billed_facts
    assert await stack.archive.batch_log(OPEN) == []


async def test_a_crash_between_any_two_steps_of_a_round_loses_no_fact_and_counts_none_twice(stack: Stack) -> None:
    whole = await replay_into_scratch(stack.bus)
    retention = stack.retention()
    # Crashed after writing a segment: it is not committed, so the round is done again from the start.
    header = SegmentHeader(index=1, first_sequence=1, last_sequence=5, previous_sha256="", chain_before="")
    await retention._write_segment(header)
    assert await stack.archive.latest_point() is None

    # Crashed after the snapshot, in the middle of the purge: the next round finishes it.
    purge_stream, purged = stack.bus.js.purge_stream, list[object]()

    async def crashing(*args: object, **kwargs: object) -> bool:
        if purged:
            raise ConnectionError("the ledger died here")
        purged.append(kwargs["subject"])
        return await purge_stream(*args, **kwargs)  # type: ignore[arg-type]

    stack.bus.js.purge_stream = crashing  # type: ignore[method-assign]
    with pytest.raises(ConnectionError):
        await retention.archive_through(len(before()), None)
    stack.bus.js.purge_stream = purge_stream  # type: ignore[method-assign]
    point = await stack.archive.latest_point()
    assert isinstance(point, ArchivePoint) and point.index == 1 and point.purge == sorted([GOOD, BAD])
    assert len(purged) == 1 and [await in_stream(stack.bus, b) == [] for b in (GOOD, BAD)].count(True) == 1

    assert await stack.retention().round() is None  # not due again: it only finishes the purge
    assert await in_stream(stack.bus, GOOD) == [] and await in_stream(stack.bus, BAD) == []
    assert [f.sequence for f in await stack.archive.batch_log(GOOD)] == [
        n + 1 for n, fact in enumerate(before()) if fact.aggregate_id == GOOD]
    for full in (False, True):
        replayed = await replay_into_scratch(stack.bus, archive=stack.archive, full=full)
        assert dumped(replayed.records) == dumped(whole.records) and replayed.chain_head == whole.chain_head
    assert await diff_against_live(stack.bus, stack.read_model, replayed) == []


async def test_a_ledger_on_an_empty_store_after_trimming_starts_from_the_archived_snapshot(
    stack: Stack, fresh_nats: RunningNats, tmp_path: Path
) -> None:
    point = await stack.retention().archive_through(len(before()), None)
    assert point is not None
    ledger = stack.app.folder.ledger if stack.app.folder else None
    assert ledger is not None
    expected = {batch_id: ledger.batch(batch_id) for batch_id in (GOOD, BAD, BATCH, OPEN)}
    fresh = stack.settings.model_copy(update={"db_path": tmp_path / "fresh.sqlite"})
    async with running_ledger(fresh_nats.url, tmp_path / "fresh.sqlite", fresh) as app:
        assert app.folder is not None
        restored = app.folder.ledger
        for batch_id, batch in expected.items():
            found = restored.batch(batch_id)
            assert found is not None and batch is not None
            assert (found.status, found.completed, found.usage) == (batch.status, batch.completed, batch.usage)
        assert restored.chain_state() == ledger.chain_state()
    out = io.StringIO()  # its chain links begin after the archived point: the segments vouch for what is before
    assert await operator.verify(fresh, out) == 0, out.getvalue()
    assert f"verified {len(after())} events" in out.getvalue()


async def test_the_folding_ledger_with_retention_on_archives_at_once_trims_the_ended_batches_and_folds_on(
    fresh_nats: RunningNats, s3_server: RunningS3, tmp_path: Path
) -> None:
    connection = own_bucket(fresh_nats, s3_server)
    store = ObjectStore.from_settings(connection)
    await store.ensure_bucket()
    bus = await EventBus.connect(fresh_nats.url, "tests")
    for fact in before():
        await bus.publish(fact)
    settings = LedgerSettings(connection=connection, db_path=tmp_path / "l.sqlite", retention=True,
                              retention_window_s=0)
    try:
        async with running_ledger(fresh_nats.url, tmp_path / "l.sqlite", settings) as app:
            for _ in range(600):  # the round runs beside the fold; wait for it (up to a minute on a loaded host)
                point = await Archive(store).latest_point()
                if point is not None and await in_stream(bus, GOOD) == []:
                    break
                await asyncio.sleep(0.1)
            for fact in after():  # the fold goes on over the trimmed stream
                head = await bus.publish(fact)
            await folded_through(app, head)
            replayed = await replay_into_scratch(bus, archive=Archive(store))
            assert await diff_against_live(bus, await ReadModel.open(bus), replayed) == []
        assert point is not None and point.last_sequence == len(before())
        assert point.purge == sorted([BAD, BATCH, GOOD]) and point.kept == [OPEN]
        assert await in_stream(bus, BATCH) == [] and (await in_stream(bus, OPEN))[:-1] == [
            n + 1 for n, fact in enumerate(before()) if fact.subject.startswith(f"evt.batch.{OPEN}.")]  # + after()'s
    finally:
        await bus.close()
        store.close()


async def test_verify_reports_an_archived_segment_changed_after_it_was_committed(stack: Stack) -> None:
    await stack.retention().archive_through(len(before()), None)
    reader = GzipReader(stack.archive.store, segment_key(1))
    lines = [line async for line in reader.lines() if line]
    edited = [line.replace(b"exec-1", b"exec-9", 1) if b"batch.started" in line else line for line in lines]
    assert edited != lines
    writer = stack.archive.segment_writer(1)
    for line in edited:
        await writer.write(line + b"\n")
    await writer.finish()

    out = io.StringIO()
    assert await operator.verify(stack.settings, out) == 1
    assert "archive breaks at segment 1" in out.getvalue()


async def test_a_segment_whose_header_breaks_the_chain_hands_out_no_fact(stack: Stack) -> None:
    await stack.retention().archive_through(len(before()), None)
    point = await stack.archive.latest_point()
    assert point is not None
    reader = GzipReader(stack.archive.store, segment_key(1))
    lines = [line async for line in reader.lines() if line]
    header = SegmentHeader.model_validate_json(lines[0])
    writer = stack.archive.segment_writer(1)
    for line in [header.model_copy(update={"chain_before": "f" * 64}).model_dump_json().encode(), *lines[1:]]:
        await writer.write(line + b"\n")
    await writer.finish()

    handed: list[object] = []
    with pytest.raises(ArchiveBroken, match="begin where the chain stood"):
        async for fact in stack.archive.verified_facts(point):
            handed.append(fact)
    assert handed == []
