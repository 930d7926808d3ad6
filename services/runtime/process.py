"""Running one service as a process: logging set-up and a clean stop on SIGINT/SIGTERM."""

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable


def configure_logging(service: str, level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format=f"%(asctime)s %(levelname)s {service} %(name)s: %(message)s",
    )
    logging.getLogger("nats").setLevel(logging.WARNING)


def run_until_signalled(main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run `main(stop)`; the first SIGINT/SIGTERM sets `stop` so it can finish cleanly."""

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await main(stop)

    asyncio.run(runner())


def run_service(name: str, log_level: str, main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """What every service's `__main__` does: configure logging, then run until signalled."""
    configure_logging(name, log_level)
    run_until_signalled(main)
