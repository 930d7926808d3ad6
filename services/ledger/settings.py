"""The ledger's settings, read from `SHESHNAG_LEDGER_*` variables."""

from pathlib import Path

from pydantic_settings import SettingsConfigDict

from services.runtime.settings import ServiceSettings


class LedgerSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="SHESHNAG_LEDGER_", extra="ignore")

    db_path: Path | None = None
    """The SQLite event store; None keeps it in memory, so every start replays the stream from sequence 1."""
    group_size: int = 1000
    """At most this many queued facts are folded and saved in one transaction (fewer when fewer wait)."""
