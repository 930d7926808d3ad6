"""The deployed ledger on PostgreSQL (the local server, and a container where Docker runs): materialises the
stream, resumes after its checkpoint, verifies its chain."""

import io
from pathlib import Path

from services.ledger import operator
from services.ledger.application import Ledger
from services.ledger.settings import LedgerSettings
from services.runtime.nats.bus import EventBus
from services.runtime.nats.readmodel import ReadModel
from services.runtime.process.settings import ConnectionSettings
from tests.conftest import RunningNats
from tests.deployment.backends import PostgresBackend
from tests.integration.test_ledger_rebuild import GOOD, history, read_model_dump, revisions, running_ledger


def postgres_settings(url: str, postgres: PostgresBackend, schema: str) -> LedgerSettings:
    return LedgerSettings(connection=ConnectionSettings(nats_url=url), postgres_dbname=postgres.dbname,
                          postgres_host=postgres.host, postgres_port=postgres.port, postgres_user=postgres.user,
                          postgres_password=postgres.password, postgres_schema=schema)


async def test_a_ledger_on_postgres_folds_exactly_once_across_restarts(
    fresh_nats: RunningNats, tmp_path: Path, postgres_backend: PostgresBackend, postgres_schema: str
) -> None:
    settings = postgres_settings(fresh_nats.url, postgres_backend, postgres_schema)
    bus = await EventBus.connect(fresh_nats.url, "tests")
    for fact in history():
        await bus.publish(fact)
    async with running_ledger(fresh_nats.url, tmp_path, settings):
        read_model = await ReadModel.open(bus)
        before, numbered = await read_model_dump(read_model), await revisions(read_model)
    async with running_ledger(fresh_nats.url, tmp_path, settings) as app:
        assert app.folder is not None and app.folder.folded == 0
        assert await revisions(read_model) == numbered and await read_model_dump(read_model) == before
    await bus.close()

    good = next(b for b in before["batches"] if b["batch"]["id"] == GOOD)
    assert good["batch"]["status"] == "completed" and good["last_sequence"] == len(history())
    store = Ledger(settings.store_env())
    try:
        assert store.folded_checkpoint() == store.checkpoint() == len(history())
    finally:
        store.close()
    replayed, verified = io.StringIO(), io.StringIO()
    assert await operator.replay(settings, replayed) == 0, replayed.getvalue()
    assert await operator.verify(settings, verified) == 0, verified.getvalue()
