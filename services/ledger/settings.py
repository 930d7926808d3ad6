"""The ledger's settings, read from `SHESHNAG_LEDGER_*` variables."""

from pathlib import Path

from pydantic_settings import SettingsConfigDict

from services.ledger.application import persistence_env
from services.runtime.process.settings import ServiceSettings


class LedgerSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="SHESHNAG_LEDGER_", extra="ignore")

    db_path: Path | None = None
    """The SQLite event store; None keeps it in memory, so every start replays the stream from sequence 1."""
    postgres_dbname: str | None = None
    """Deployed: the PostgreSQL database of the event store (takes precedence over `db_path`)."""
    postgres_host: str = "127.0.0.1"
    """The PostgreSQL host of a deployed ledger (with `postgres_dbname`; unset: SQLite)."""
    postgres_port: int = 5432
    """The PostgreSQL port."""
    postgres_user: str = "postgres"
    """The PostgreSQL user."""
    postgres_password: str = ""
    """The PostgreSQL password."""
    postgres_schema: str = ""
    """A schema of its own, e.g. when several ledgers share one database."""
    standby: bool = False
    """Fold only while holding the ledger's lease (KV, like the scheduler's): several ledgers on one PostgreSQL
    store, one folding, the others standing by to go on from its checkpoint. Off: one ledger, restarted by its
    supervisor (a standby with a store of its own would replay from sequence 1 over the live read model)."""
    leader_ttl_s: float = 10.0
    """With `standby`: a folding ledger that stops renewing its lease is replaced after this long."""
    group_size: int = 5000
    """At most this many queued facts are folded and saved in one transaction (fewer when fewer wait)."""
    fold_pace_s: float = 0.05
    """While the log is busy (`fold_busy_facts_per_s` or more), a fold group starts at least this long after the
    previous one: facts arriving meanwhile are folded, saved and put into the read model together, so a batch's quick
    run of facts costs one read-model write, not one per fact. The read model then lags the log by up to this much
    more; a quiet log's facts wait only `fold_gather_s`. 0: never paced."""
    fold_busy_facts_per_s: float = 250.0
    """Facts folded in the last second from which the log counts as busy (and `fold_pace_s` applies): a burst of
    batches (hundreds of facts a second), not one client's batches one after another (a 1-line batch's life is
    ~12 facts in ~40 ms)."""

    fold_gather_s: float = 0.01
    """A live fold waits this long for more facts after one arrives alone, so a batch's quick run of facts (a
    create's `used` and `created`, a verdict's progress and verdict, an end's `finalizing`, files and end) is folded,
    saved, checkpointed and put into the read model together, not once per fact: a third less of the ledger's CPU on
    a moderately loaded stack. The read model lags the log by up to this much more. 0: folded at once."""

    retention: bool = False
    """Archive and trim the EVENTS stream (the folding ledger only): once every `segment_period_s` the facts folded
    since the last archived point go to the object store as one hash-chained segment with a snapshot of the
    ledger's state, and the facts of batches ended more than `retention_window_s` ago leave the stream (each such
    batch's log stays readable from the archive). Off: the stream keeps every fact for ever. Any ledger restores
    from the archive when its store is behind a trimmed stream, whatever this says."""
    retention_window_s: float = 30 * 86400.0
    """How long an ended batch's facts stay in the stream after it ended; at least the longest expiry of its output
    files (clients may follow its event log until then)."""
    segment_period_s: float = 86400.0
    """How often the facts folded since the last archived point are archived as one segment (the first round runs as
    soon as retention is on)."""

    def store_env(self) -> dict[str, str]:
        """The eventsourcing persistence settings for this ledger's store."""
        if not self.postgres_dbname:
            return persistence_env(self.db_path)
        env = {"PERSISTENCE_MODULE": "eventsourcing.postgres", "POSTGRES_DBNAME": self.postgres_dbname,
               "POSTGRES_HOST": self.postgres_host, "POSTGRES_PORT": str(self.postgres_port),
               "POSTGRES_USER": self.postgres_user, "POSTGRES_PASSWORD": self.postgres_password}
        if self.postgres_schema:
            env["POSTGRES_SCHEMA"] = self.postgres_schema
        return env
