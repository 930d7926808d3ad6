"""Operators' tools against a real broker: audit timelines, export, replay's diff, and verify catching tampering."""

import io
import json
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

from contracts.subjects import EVENTS_STREAM
from infra.embedded import free_port, start_nats, stop_process
from services.ledger import operator
from services.ledger.settings import LedgerSettings
from services.runtime.nats import eventlog
from services.runtime.nats.bus import EventBus
from services.runtime.nats.readmodel import ReadModel
from tests.conftest import RunningNats
from tests.integration.test_ledger_rebuild import GOOD, history, running_ledger, sqlite_settings
from tests.support import put_batch

TAMPERED = 40


async def publish_history(url: str) -> int:
    bus = await EventBus.connect(url, "tests")
    try:
        for fact in history():
            head = await bus.publish(fact)
    finally:
        await bus.close()
    return head


async def test_audit_lists_the_batchs_timeline_with_actors_attempts_model_and_engine(
    fresh_nats: RunningNats, tmp_path: Path
) -> None:
    await publish_history(fresh_nats.url)
    out = io.StringIO()
    assert await operator.audit(sqlite_settings(fresh_nats.url, tmp_path / "l.sqlite"), GOOD, True, out) == 0
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["type"] for r in rows] == ["batch.created", "batch.validated", "batch.waiting", "batch.assigned",
                                         "batch.started", "batch.progressed", "batch.waiting", "batch.progressed",
                                         "batch.finalizing", "batch.completed"]
    assert rows[0]["actor"] == "key_ab" and rows[4]["actor"] == "exec-1"
    assert rows[6]["note"] == "Running on 1 executor: 50 % done, under a minute left."
    assert rows[-2]["engine"] == "llamacpp 1" and rows[-2]["attempt"] == 1 and rows[-1]["model"] == "m"
    assert "tokens in=40" in rows[-1]["counts"]
    assert [r["sequence"] for r in rows] == sorted(r["sequence"] for r in rows)

    table = io.StringIO()
    await operator.audit(sqlite_settings(fresh_nats.url, tmp_path / "l.sqlite"), GOOD, False, table)
    assert table.getvalue().splitlines()[0].split() == ["time", "sequence", "type", "actor", "attempt", "model",
                                                         "engine", "counts", "note"]


async def test_export_writes_the_events_of_a_time_range_as_jsonl(fresh_nats: RunningNats, tmp_path: Path) -> None:
    head = await publish_history(fresh_nats.url)
    settings = sqlite_settings(fresh_nats.url, tmp_path / "l.sqlite")
    everything, nothing = io.StringIO(), io.StringIO()
    hour = timedelta(hours=1)
    await operator.export(settings, datetime.now(UTC) - hour, datetime.now(UTC) + hour, everything)
    await operator.export(settings, datetime.now(UTC) + hour, None, nothing)
    lines = [json.loads(line) for line in everything.getvalue().splitlines()]
    assert [line["sequence"] for line in lines] == list(range(1, head + 1))
    assert lines[0]["event"]["type"] == "key.created" and lines[0]["subject"].startswith("evt.key.")
    assert nothing.getvalue() == ""


async def test_replay_matches_the_live_read_model_and_reports_a_corrupted_record(
    fresh_nats: RunningNats, tmp_path: Path
) -> None:
    await publish_history(fresh_nats.url)
    settings = sqlite_settings(fresh_nats.url, tmp_path / "l.sqlite")
    async with running_ledger(fresh_nats.url, tmp_path / "l.sqlite"):
        pass
    out = io.StringIO()
    assert await operator.replay(settings, out) == 0
    assert "events/s" in out.getvalue() and "matches" in out.getvalue()

    bus = await EventBus.connect(fresh_nats.url, "tests")
    read_model = await ReadModel.open(bus)
    record = await read_model.get_batch(GOOD)
    assert record is not None
    await put_batch(read_model, record.model_copy(update={"last_sequence": 1}))
    await bus.close()
    out = io.StringIO()
    assert await operator.replay(settings, out) == 1
    assert f"DIFFERS batch.{GOOD}" in out.getvalue()


async def test_verify_passes_on_the_log_the_ledger_folded(fresh_nats: RunningNats, tmp_path: Path) -> None:
    await publish_history(fresh_nats.url)
    async with running_ledger(fresh_nats.url, tmp_path / "l.sqlite"):
        pass
    out = io.StringIO()
    assert await operator.verify(sqlite_settings(fresh_nats.url, tmp_path / "l.sqlite"), out) == 0
    assert f"verified {len(history())} events" in out.getvalue()


@asynccontextmanager
async def copy_of_the_stream(fresh_nats: RunningNats, tmp_path: Path) -> AsyncIterator[tuple[EventBus, LedgerSettings]]:
    """A ledger store that folded the history, and a broker on a copy of the data taken after it stopped."""
    await publish_history(fresh_nats.url)
    async with running_ledger(fresh_nats.url, tmp_path / "l.sqlite"):
        pass
    stop_process(fresh_nats.process)
    copy = tmp_path / "copy"
    shutil.copytree(tmp_path / "nats", copy / "nats")
    port = free_port()
    server = start_nats(copy, port, copy / "nats.log")
    try:
        bus = await EventBus.connect(f"nats://127.0.0.1:{port}", "tamper")
        yield bus, sqlite_settings(f"nats://127.0.0.1:{port}", tmp_path / "l.sqlite")
        await bus.close()
    finally:
        stop_process(server)


async def test_verify_fails_where_an_event_was_deleted_from_a_copy_of_the_stream(
    fresh_nats: RunningNats, tmp_path: Path
) -> None:
    out = io.StringIO()
    async with copy_of_the_stream(fresh_nats, tmp_path) as (bus, settings):
        assert await bus.js.delete_msg(EVENTS_STREAM, TAMPERED)
        assert await operator.verify(settings, out) == 1
    assert f"chain breaks at sequence {TAMPERED}: the event is missing" in out.getvalue()


async def test_verify_fails_where_an_event_was_edited_in_a_copy_of_the_stream(
    fresh_nats: RunningNats, tmp_path: Path
) -> None:
    out = io.StringIO()
    async with copy_of_the_stream(fresh_nats, tmp_path) as (bus, settings):
        messages = [(fact.subject, fact.data) async for fact in eventlog.read(bus)]
        await bus.js.delete_stream(EVENTS_STREAM)
        await bus.ensure_streams()
        for sequence, (subject, data) in enumerate(messages, start=1):
            if sequence == TAMPERED:
                data = data.replace(b'"line":', b'"line":1', 1)  # one line number changed
            await bus.js.publish(subject, data, stream=EVENTS_STREAM)
        assert await operator.verify(settings, out) == 1
    assert f"chain breaks at sequence {TAMPERED}: the event's bytes differ" in out.getvalue()
