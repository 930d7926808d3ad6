"""The ledger's SQLite file is written in WAL mode, synced at WAL checkpoints rather than at every commit (the store
is derived from the stream: a commit a power loss takes back is folded again from the store's own checkpoint)."""

from pathlib import Path

from services.ledger.application import Ledger, persistence_env


def pragma(ledger: Ledger, name: str) -> object:
    connection = ledger.factory.datastore.pool.get_connection()  # type: ignore[attr-defined]
    try:
        cursor = connection.cursor()
        cursor.execute(f"PRAGMA {name};")
        return cursor.fetchone()[0]
    finally:
        ledger.factory.datastore.pool.put_connection(connection)  # type: ignore[attr-defined]


def test_the_ledger_file_is_in_wal_mode_and_synced_at_checkpoints_not_every_commit(tmp_path: Path) -> None:
    ledger = Ledger(persistence_env(tmp_path / "ledger.db"))
    try:
        ledger.record_checkpoint(7)
        assert pragma(ledger, "journal_mode") == "wal"
        assert pragma(ledger, "synchronous") == 1, "NORMAL"
    finally:
        ledger.close()
    reopened = Ledger(persistence_env(tmp_path / "ledger.db"))
    try:
        assert reopened.checkpoint() == 7, "what was committed reads back"
    finally:
        reopened.close()
