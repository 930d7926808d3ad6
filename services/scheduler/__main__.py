"""`python -m services.scheduler`: run the scheduler until SIGINT/SIGTERM."""

from services.runtime.process.runner import run_service
from services.scheduler.app import run_scheduler
from services.scheduler.settings import SchedulerSettings


def main() -> None:
    settings = SchedulerSettings()
    run_service("scheduler", settings.connection.log_level, lambda stop: run_scheduler(settings, stop),
                metrics=settings.metrics_endpoint())


if __name__ == "__main__":
    main()
