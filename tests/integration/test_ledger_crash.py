"""Kill -9 the ledger process at random points of its fold; after a restart the state is as if it never crashed."""

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from contracts.events.envelope import Event
from services.ledger.application import Ledger, persistence_env
from services.ledger.chain import first_break
from services.ledger.replay import diff_against_live
from services.runtime.nats import eventlog
from services.runtime.nats.bus import EventBus
from services.runtime.nats.readmodel import ReadModel
from tests.conftest import RunningNats
from tests.factories import batch_life
from tests.integration.test_ledger_rebuild import running_ledger

BATCHES, CHUNKS, CRASHES = 12, 150, 4


def batch_story(n: int) -> list[Event]:
    return batch_life(f"batch_crash{n}", CHUNKS, lines_per_chunk=10, owner_key_id="key_ab", tokens_per_line=(7, 3))


def start_ledger(url: str, db_path: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "SHESHNAG_NATS_URL": url, "SHESHNAG_LEDGER_DB_PATH": str(db_path),
           "SHESHNAG_LEDGER_GROUP_SIZE": "7"}
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "services.ledger"], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def resumed(log: Path, times: int) -> None:
    """Until the ledger process has said, for the `times`-th time, where it resumes (its fold starts then)."""
    while log.read_text().count("ledger resumes after") < times:
        time.sleep(0.02)


async def test_a_ledger_killed_mid_fold_restarts_to_the_same_state_as_a_clean_replay(
    fresh_nats: RunningNats, tmp_path: Path
) -> None:
    seed = random.randrange(1 << 30)
    chance = random.Random(seed)
    print(f"crash points drawn with seed {seed}")
    db_path = tmp_path / "ledger.sqlite"
    bus = await EventBus.connect(fresh_nats.url, "tests")
    stories = [batch_story(n) for n in range(BATCHES)]
    for crash in range(CRASHES):
        for story in stories[crash::CRASHES]:  # new facts before every run, so every run has folding to do
            for fact in story:
                await bus.publish(fact)
        ledger = start_ledger(fresh_nats.url, db_path, tmp_path / "ledger.log")
        await asyncio.to_thread(resumed, tmp_path / "ledger.log", crash + 1)
        await asyncio.sleep(chance.uniform(0.0, 0.4))  # a random point of this run's fold
        os.kill(ledger.pid, signal.SIGKILL)
        ledger.wait()

    async with running_ledger(fresh_nats.url, db_path):
        read_model = await ReadModel.open(bus)
        assert await diff_against_live(bus, read_model) == [], f"seed {seed}"
        batches = await read_model.list_batches()
    log = [fact async for fact in eventlog.read(bus)]
    await bus.close()

    assert len(batches) == BATCHES and {b.batch.status for b in batches} == {"completed"}
    assert {b.batch.usage.total_tokens for b in batches if b.batch.usage} == {10 * CHUNKS * 10}
    store = Ledger(persistence_env(db_path))
    try:
        assert store.folded_checkpoint() == len(log) == store.checkpoint()
        assert all(store.anomalies(f"batch_crash{n}") == [] for n in range(BATCHES))
        assert first_break(store.chain_links(), log) == (len(log), None)
    finally:
        store.close()
