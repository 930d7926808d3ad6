"""The deployed ledger on PostgreSQL: materialises the stream, resumes after its checkpoint, verifies its chain."""

import io
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import TypedDict

import psycopg
import pytest

from services.ledger import operator
from services.ledger.application import Ledger
from services.ledger.settings import LedgerSettings
from services.runtime.bus import EventBus
from services.runtime.readmodel import ReadModel
from services.runtime.settings import ConnectionSettings
from tests.conftest import RunningNats
from tests.integration.test_ledger_rebuild import GOOD, history, read_model_dump, revisions, running_ledger


class PostgresParams(TypedDict):
    """Connection parameters of the test PostgreSQL server, as psycopg takes them."""

    dbname: str
    host: str
    port: int
    user: str
    password: str


PG = PostgresParams(
    dbname=os.environ.get("POSTGRES_DBNAME", "test"), host=os.environ.get("POSTGRES_HOST", "127.0.0.1"),
    port=int(os.environ.get("POSTGRES_PORT", "5432")), user=os.environ.get("POSTGRES_USER", "postgres"),
    password=os.environ.get("POSTGRES_PASSWORD", ""))


@pytest.fixture
def schema() -> Iterator[str]:
    """A schema of the test's own in the PostgreSQL server, dropped afterwards."""
    name = f"ledger_{secrets.token_hex(4)}"
    try:
        connection = psycopg.connect(**PG, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as error:
        pytest.skip(f"PostgreSQL is not reachable at {PG['host']}:{PG['port']}: {error}")
    with connection:
        connection.execute(f"CREATE SCHEMA {name}")
        yield name
        connection.execute(f"DROP SCHEMA {name} CASCADE")


def postgres_settings(url: str, schema: str) -> LedgerSettings:
    return LedgerSettings(connection=ConnectionSettings(nats_url=url), postgres_dbname=PG["dbname"],
                          postgres_host=PG["host"], postgres_port=PG["port"], postgres_user=PG["user"],
                          postgres_password=PG["password"], postgres_schema=schema)


async def test_a_ledger_on_postgres_folds_exactly_once_across_restarts(
    fresh_nats: RunningNats, tmp_path: Path, schema: str
) -> None:
    settings = postgres_settings(fresh_nats.url, schema)
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
