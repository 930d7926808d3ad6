"""`python -m services.ledger`: run the ledger until SIGINT/SIGTERM."""

from services.ledger.app import run_ledger
from services.ledger.settings import LedgerSettings
from services.runtime.process.runner import run_service


def main() -> None:
    settings = LedgerSettings()
    run_service("ledger", settings.connection.log_level, lambda stop: run_ledger(settings, stop),
                metrics=settings.metrics_endpoint())


if __name__ == "__main__":
    main()
