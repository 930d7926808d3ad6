"""Two ledgers standing by for each other (`SHESHNAG_LEDGER_STANDBY`) on one PostgreSQL store and a 3-node
JetStream cluster: one folds; paused past its lease, the other folds on from the shared checkpoint; back, the first
finds its lease gone and stops; the store equals a replay from sequence 1."""

import asyncio
import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from eventsourcing.persistence import PersistenceError

from contracts.events.envelope import Event
from infra.embedded import stop_process
from infra.nats_cluster import NatsCluster
from services.ledger import operator
from services.ledger.application import Ledger
from services.ledger.settings import LedgerSettings
from services.runtime.nats.bus import EventBus
from services.runtime.process.settings import ConnectionSettings
from tests.deployment.backends import PostgresBackend
from tests.integration.test_ledger_rebuild import history

LEASE_TTL_S = 2.0


def ledger_env(cluster: NatsCluster, postgres: PostgresBackend, schema: str) -> dict[str, str]:
    return dict(os.environ, SHESHNAG_NATS_URL=cluster.core_urls(), SHESHNAG_NATS_REPLICAS="3",
                SHESHNAG_METRICS_PORT="0", SHESHNAG_LEDGER_STANDBY="true",
                SHESHNAG_LEDGER_LEADER_TTL_S=str(LEASE_TTL_S), SHESHNAG_LEDGER_POSTGRES_DBNAME=postgres.dbname,
                SHESHNAG_LEDGER_POSTGRES_HOST=postgres.host, SHESHNAG_LEDGER_POSTGRES_PORT=str(postgres.port),
                SHESHNAG_LEDGER_POSTGRES_USER=postgres.user, SHESHNAG_LEDGER_POSTGRES_PASSWORD=postgres.password,
                SHESHNAG_LEDGER_POSTGRES_SCHEMA=schema)


def until(condition: Callable[[], bool], what: str | Callable[[], str], within_s: float = 120) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, what() if callable(what) else what
        time.sleep(0.2)


def folded_through(settings: LedgerSettings) -> int:
    """The read-model checkpoint kept in the shared store (-1 while the ledger is still making its tables: opening a
    store makes them too, and PostgreSQL refuses two such DDLs at once)."""
    try:
        store = Ledger(settings.store_env())
    except PersistenceError:
        return -1
    try:
        return store.checkpoint()
    finally:
        store.close()


async def publish(url: str, facts: list[Event]) -> None:
    bus = await EventBus.connect(url, "tests", replicas=3)
    try:
        for fact in facts:
            await bus.publish(fact)
    finally:
        await bus.close()


def test_a_standby_ledger_folds_on_from_the_shared_checkpoint_while_the_folding_one_is_paused(
        tmp_path: Path, postgres_backend: PostgresBackend, postgres_schema: str) -> None:
    cluster = NatsCluster.plan(tmp_path / "nats")
    cluster.start()
    processes: list[subprocess.Popen[bytes]] = []
    settings = LedgerSettings(connection=ConnectionSettings(nats_url=cluster.core_urls()),
                              postgres_dbname=postgres_backend.dbname, postgres_host=postgres_backend.host,
                              postgres_port=postgres_backend.port, postgres_user=postgres_backend.user,
                              postgres_password=postgres_backend.password, postgres_schema=postgres_schema)
    try:
        facts = history()
        early, late = facts[:len(facts) // 2], facts[len(facts) // 2:]
        asyncio.run(publish(cluster.core_urls(), early))
        logs = [tmp_path / "ledger-a.log", tmp_path / "ledger-b.log"]

        def log(n: int) -> str:
            return logs[n].read_text(errors="replace") if logs[n].exists() else ""

        for n, path in enumerate(logs):
            with path.open("ab") as out:
                processes.append(subprocess.Popen([sys.executable, "-m", "services.ledger"], stdout=out,
                                                  stderr=subprocess.STDOUT,
                                                  env=ledger_env(cluster, postgres_backend, postgres_schema)))
            until(lambda n=n: ("is the leader" if n == 0 else "stands by") in log(n),  # type: ignore[misc]
                  lambda n=n: f"ledger {'ab'[n]} never said it leads or stands by: {log(n)[-1500:]}")  # type: ignore[misc]
        until(lambda: folded_through(settings) == len(early),
              lambda: f"the leading ledger did not fold what was there: {log(0)[-1500:]}")

        os.kill(processes[0].pid, signal.SIGSTOP)  # alive and silent, its lease still in the bucket
        try:
            asyncio.run(publish(cluster.core_urls(), late))
            until(lambda: "is the leader" in log(1), lambda: f"the standby never took over: {log(1)[-1500:]}")
            until(lambda: folded_through(settings) == len(facts),
                  lambda: f"the standby did not fold on from the checkpoint: {log(1)[-1500:]}")
        finally:
            os.kill(processes[0].pid, signal.SIGCONT)
        assert processes[0].wait(30) != 0 and "lost its lease" in log(0), log(0)[-1500:]

        report = io.StringIO()
        assert asyncio.run(operator.replay(settings, report)) == 0, report.getvalue()
    finally:
        for process in processes:
            stop_process(process, within_s=30)
        cluster.stop()
