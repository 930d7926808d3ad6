"""The ledger's SQLite store: eventsourcing's own, each file connection at `synchronous=NORMAL` (WAL mode), not `FULL`'s
~5 ms disk wait per commit. A power loss may take back the last commits (the database stays consistent): the ledger
folds them again from the EVENTS stream, from the checkpoint saved with its effects, as after any crash."""

from eventsourcing.persistence import Environment
from eventsourcing.sqlite import SQLiteConnection, SQLiteConnectionPool, SQLiteFactory

FACTORY_TOPIC = f"{__name__}:RelaxedSyncSQLiteFactory"
"""What `PERSISTENCE_MODULE` names to use this store."""


class RelaxedSyncPool(SQLiteConnectionPool):
    def _create_connection(self) -> SQLiteConnection:
        connection = super()._create_connection()
        if not self.is_sqlite_memory_mode:
            connection.cursor().execute("PRAGMA synchronous=NORMAL;")
        return connection


class RelaxedSyncSQLiteFactory(SQLiteFactory):
    def __init__(self, env: Environment) -> None:
        super().__init__(env)
        made = self.datastore.pool  # no connection is open yet: the first is made on first use
        self.datastore.pool = RelaxedSyncPool(db_name=made.db_name, lock_timeout=made.lock_timeout)
        made.close()
