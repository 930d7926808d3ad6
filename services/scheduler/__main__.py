"""`python -m services.scheduler`."""

import asyncio

from services.runtime.process import configure_logging, run_until_signalled
from services.scheduler.app import run_scheduler
from services.scheduler.settings import SchedulerSettings


def main() -> None:
    settings = SchedulerSettings()
    configure_logging("scheduler", settings.connection.log_level)

    async def run(stop: asyncio.Event) -> None:
        await run_scheduler(settings, stop)

    run_until_signalled(run)


if __name__ == "__main__":
    main()
