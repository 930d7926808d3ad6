"""A service started before JetStream can make its streams waits for them, saying so, then runs: against a real
nats-server first without JetStream (what a cluster's nodes answer before a meta leader is elected) and then with
it; and the retry helper itself against the 'insufficient resources' of a cluster with too few servers up."""

import asyncio
import logging
from pathlib import Path

import nats.js.errors
import pytest

from contracts.subjects import EVENTS_STREAM, READ_MODEL_BUCKET, WORK_STREAM
from infra.embedded import free_port, launch, start_nats, stop_process, venv_binary, wait_for_port
from services.runtime.nats import placement
from services.runtime.nats.bus import EventBus
from services.runtime.nats.readmodel import ReadModel

INSUFFICIENT_RESOURCES = 10023


@pytest.fixture
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(placement, "FIRST_WAIT_S", 0.05)
    monkeypatch.setattr(placement, "MAX_WAIT_S", 0.1)


async def test_a_service_started_before_jetstream_is_ready_waits_for_its_streams_then_runs(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, quick_retries: None) -> None:
    caplog.set_level(logging.INFO, logger=placement.__name__)
    port = free_port()
    early = launch([venv_binary("nats-server"), "-a", "127.0.0.1", "-p", str(port)], tmp_path / "early.log")
    wait_for_port(port, early, 15.0, "nats-server")
    ready = None
    try:
        starting = asyncio.create_task(EventBus.connect(f"nats://127.0.0.1:{port}", "cold-start"))
        for _ in range(400):  # it has tried to make its first stream (on a loaded machine, seconds after it started)
            if starting.done() or any("cannot be created yet" in r.getMessage() for r in caplog.records):
                break
            await asyncio.sleep(0.05)
        assert not starting.done(), "it waits; it does not crash"
        stop_process(early)
        ready = start_nats(tmp_path, port, tmp_path / "nats.log")  # the same address, JetStream on
        bus = await asyncio.wait_for(starting, 20)
        try:
            assert {info.config.name for info in await bus.js.streams_info()} >= {EVENTS_STREAM, WORK_STREAM}
            await ReadModel.open(bus)  # and its buckets
            assert (await bus.js.stream_info(f"KV_{READ_MODEL_BUCKET}")).config.name == f"KV_{READ_MODEL_BUCKET}"
        finally:
            await bus.close()
    finally:
        stop_process(early)
        if ready is not None:
            stop_process(ready)
    waiting = [r.getMessage() for r in caplog.records if "cannot be created yet" in r.getMessage()]
    assert len(waiting) == 1 and f"stream {EVENTS_STREAM}" in waiting[0], "said once, not once per try"
    assert any(f"stream {EVENTS_STREAM} created after waiting" in r.getMessage() for r in caplog.records)


async def test_insufficient_resources_is_waited_out_and_any_other_refusal_raised_at_once(
        caplog: pytest.LogCaptureFixture, quick_retries: None) -> None:
    tries = 0

    async def make() -> str:
        nonlocal tries
        tries += 1
        if tries < 4:
            raise nats.js.errors.ServiceUnavailableError(code=503, err_code=INSUFFICIENT_RESOURCES,
                                                         description="insufficient resources")
        return "placed"

    assert await placement.until_placed("stream R3", make) == "placed"
    assert tries == 4
    waiting = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(waiting) == 1 and "insufficient resources" in waiting[0]

    async def refused() -> str:
        raise nats.js.errors.BadRequestError(code=400, err_code=10058, description="stream name already in use")

    with pytest.raises(nats.js.errors.BadRequestError):
        await placement.until_placed("stream other", refused)
