"""`python -m services.executor`."""

import asyncio

from services.executor.app import run_executor
from services.executor.settings import ExecutorSettings
from services.runtime.process import configure_logging, run_until_signalled


def main() -> None:
    settings = ExecutorSettings()
    configure_logging("executor", settings.connection.log_level)

    async def run(stop: asyncio.Event) -> None:
        await run_executor(settings, stop)

    run_until_signalled(run)


if __name__ == "__main__":
    main()
