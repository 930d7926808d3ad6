"""`python -m services.validator`."""

import asyncio

from services.runtime.process import configure_logging, run_until_signalled
from services.validator.app import run_validator
from services.validator.settings import ValidatorSettings


def main() -> None:
    settings = ValidatorSettings()
    configure_logging("validator", settings.connection.log_level)

    async def run(stop: asyncio.Event) -> None:
        await run_validator(settings, stop)

    run_until_signalled(run)


if __name__ == "__main__":
    main()
