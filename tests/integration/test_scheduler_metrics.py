"""The scheduler's own `/metrics` (`SHESHNAG_SCHEDULER_METRICS_PORT`), scraped from two real scheduler processes on
one broker: the leader says it leads and shows the batches as its book sees them (a held batch as held, not
queued); the standby says it stands by and shows no batches. No label names a batch, key or executor."""

import asyncio
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from contracts.events.batch import BatchValidated
from contracts.ids import new_batch_id
from infra.embedded import free_port, stop_process
from services.runtime.nats.bus import EventBus
from tests.conftest import RunningNats
from tests.factories import batch_created

MODEL = "smollm2-135m-instruct-q4_1"
OWNER_KEY = "key_owner_secret_id"
SCRAPE_WITHIN_S = 60.0
LABEL = re.compile(r'(\w+)="([^"]*)"')


def scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            return str(answer.read().decode())
    except (urllib.error.URLError, ConnectionError):
        return ""


def sample(text: str, name: str, labels: str = "") -> float | None:
    match = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else None


@pytest.fixture
def schedulers(fresh_nats: RunningNats, tmp_path: Path) -> Iterator[list[int]]:
    """Two scheduler processes, each serving `/metrics` on a port of its own; their metrics ports."""
    ports, processes = [free_port(), free_port()], []
    for index, port in enumerate(ports):
        env = {**os.environ, "SHESHNAG_NATS_URL": fresh_nats.url, "SHESHNAG_SCHEDULER_METRICS_PORT": str(port),
               "SHESHNAG_SCHEDULER_TICK_S": "0.2"}
        with (tmp_path / f"scheduler-{index}.log").open("ab") as log:
            processes.append(subprocess.Popen([sys.executable, "-m", "services.scheduler"], env=env, stdout=log,
                                              stderr=subprocess.STDOUT))
    try:
        yield ports
    finally:
        for process in processes:
            stop_process(process, within_s=20)


async def validated_batch(bus: EventBus, hold: bool) -> None:
    batch_id = new_batch_id()
    await bus.publish(batch_created(batch_id, OWNER_KEY, "files/f", created_at=0, expires_at=int(time.time()) + 3600,
                                    hold=hold))
    await bus.publish(BatchValidated(aggregate_id=batch_id, total_lines=2, model=MODEL))


async def test_the_leader_and_the_standby_each_say_what_they_are_and_the_leader_shows_held_apart_from_queued(
        fresh_nats: RunningNats, schedulers: list[int]) -> None:
    bus = await EventBus.connect(fresh_nats.url, "tests")
    try:
        await validated_batch(bus, hold=True)
        await validated_batch(bus, hold=False)
    finally:
        await bus.close()
    deadline = time.monotonic() + SCRAPE_WITHIN_S
    while True:
        texts = [await asyncio.to_thread(scrape, port) for port in schedulers]
        leaders = [text for text in texts if sample(text, "sheshnag_scheduler_leader") == 1.0]
        standbys = [text for text in texts if sample(text, "sheshnag_scheduler_leader") == 0.0]
        if len(leaders) == 1 and len(standbys) == 1 \
                and sample(leaders[0], "sheshnag_scheduler_batches", '{state="held"}') == 1.0 \
                and sample(leaders[0], "sheshnag_scheduler_batches", '{state="queued"}') == 1.0:
            break
        assert time.monotonic() < deadline, texts
        await asyncio.sleep(0.5)
    [leader], [standby] = leaders, standbys
    assert sample(leader, "sheshnag_scheduler_batches", '{state="queued"}') == 1.0  # no executor: it waits
    assert sample(leader, "sheshnag_scheduler_batches", '{state="running"}') == 0.0
    assert "sheshnag_scheduler_batches{" not in standby
    for text in (leader, standby):
        assert "# TYPE sheshnag_scheduler_assignments_total counter" in text
        assert "# TYPE sheshnag_scheduler_attempts_fenced_total counter" in text
        assert "# TYPE sheshnag_scheduler_registrations_total counter" in text
        assert OWNER_KEY not in text
        labels = {name for line in text.splitlines() if line.startswith("sheshnag_")
                  for name, _ in LABEL.findall(line)}
        assert labels <= {"state", "kind", "code", "outcome", "durable"}, labels
