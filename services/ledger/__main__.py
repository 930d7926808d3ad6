"""`python -m services.ledger`: run the ledger until SIGINT/SIGTERM."""

from services.ledger.app import run_ledger
from services.ledger.settings import LedgerSettings
from services.runtime.process import configure_logging, run_until_signalled


def main() -> None:
    settings = LedgerSettings()
    configure_logging("ledger", settings.connection.log_level)
    run_until_signalled(lambda stop: run_ledger(settings, stop))


if __name__ == "__main__":
    main()
