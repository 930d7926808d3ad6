"""The ledger's SQLite store: eventsourcing's own, with each file connection at `synchronous=NORMAL` (WAL mode).

The default (`FULL`) syncs the disk at every commit: about 5 ms of waiting and 0.1 ms of CPU per fold group, twice
per group (its effects, then the read-model checkpoint). In WAL mode `NORMAL` syncs at WAL checkpoints only; the
database stays consistent through a power loss, which may take back the last commits. Nothing is lost with them:
the store is derived from the EVENTS stream, and a ledger folds again from the checkpoint its store kept (saved in
the same transaction as the effects it covers), as it does after any crash.
"""

from eventsourcing.persistence import Environment
from eventsourcing.sqlite import SQLiteConnection, SQLiteConnectionPool, SQLiteFactory

FACTORY_TOPIC = f"{__name__}:RelaxedSyncSQLiteFactory"
"""What `PERSISTENCE_MODULE` names to use this store."""


class RelaxedSyncPool(SQLiteConnectionPool):
    def _create_connection(self) -> SQLiteConnection:
        connection = super()._create_connection()
        if not self.is_sqlite_memory_mode:
            cursor = connection.cursor()
            cursor.execute("PRAGMA synchronous=NORMAL;")
        return connection


class RelaxedSyncSQLiteFactory(SQLiteFactory):
    def __init__(self, env: Environment) -> None:
        super().__init__(env)
        made = self.datastore.pool  # no connection is open yet: the first is made on first use
        self.datastore.pool = RelaxedSyncPool(db_name=made.db_name, lock_timeout=made.lock_timeout)
        made.close()
