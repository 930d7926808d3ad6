"""`python -m services.validator`: run the validator until SIGINT/SIGTERM."""

from services.runtime.process.runner import run_service
from services.validator.app import run_validator
from services.validator.settings import ValidatorSettings


def main() -> None:
    settings = ValidatorSettings()
    run_service("validator", settings.connection.log_level, lambda stop: run_validator(settings, stop),
                metrics=settings.metrics_endpoint())


if __name__ == "__main__":
    main()
