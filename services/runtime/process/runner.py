"""Running one service as a process: logging set-up and a clean stop on SIGINT/SIGTERM."""

import asyncio
import logging
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable

import uvloop

from services.runtime.process.logfmt import JsonFormatter, TraceFields
from services.runtime.process.metrics import serve_metrics
from services.runtime.process.native_stderr import capture as capture_native_stderr
from services.runtime.process.settings import ConnectionSettings
from services.runtime.process.telemetry import configure_tracing


def configure_logging(service: str, level: str) -> None:
    """Plain lines on a terminal; JSON lines (with batch_id, trace_id, span_id) when not on a TTY."""
    handler = logging.StreamHandler()
    handler.addFilter(TraceFields())
    if sys.stderr.isatty():
        handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s {service} %(name)s: %(message)s"))
    else:
        handler.setFormatter(JsonFormatter(service))
    logging.basicConfig(level=level.upper(), handlers=[handler])
    logging.getLogger("nats").setLevel(logging.WARNING)


def configure_observability(service: str, level: str, metrics: tuple[str, int]) -> None:
    """Logs, tracing (by `OTEL_*`) and `/metrics` at `metrics` (`ServiceSettings.metrics_endpoint()`)."""
    configure_logging(service, level)
    configure_tracing(service)
    serve_metrics(metrics[1], metrics[0])


SUPERVISOR_PID = "SHESHNAG_SUPERVISOR_PID"
"""Set by `sheshnag up` for the services it starts: their supervisor's pid (see `_stop_when_orphaned`)."""
SUPERVISOR_CHECK_S = 1.0
STOP_POLL_S = 0.5
STOP_GRACE_S = 90.0
"""How long a clean stop may take (requests in flight end by their own timeouts well within it) before the
process exits anyway: a service always stops on SIGTERM."""


def run_until_signalled(main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run `main(stop)`; the first SIGINT/SIGTERM sets `stop` so it can finish cleanly, a second one ends the process
    at once. However `stop` is set (a signal, or the service itself: its broker connection closed for good), a clean
    stop that takes longer than `STOP_GRACE_S` ends the process too, so its supervisor starts it afresh."""

    def exit_now(why: str) -> None:
        logging.getLogger(__name__).warning("exiting without a clean stop: %s", why)
        logging.shutdown()
        os._exit(1)

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        signals = 0

        def signalled() -> None:
            nonlocal signals
            signals += 1
            if signals > 1:
                exit_now("signalled again while stopping")
            stop.set()

        def exit_if_stop_hangs() -> None:
            """A thread, not a task: a stop whose event loop is held (a task that never yields) ends all the same."""
            while not stop.is_set():
                if finished.wait(STOP_POLL_S):
                    return
            if not finished.wait(STOP_GRACE_S):
                exit_now(f"the clean stop took over {STOP_GRACE_S:.0f}s")

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, signalled)
        # A daemon thread: a clean stop that ends in time does not wait for it.
        threading.Thread(target=exit_if_stop_hangs, name="stop-deadline", daemon=True).start()
        watch = asyncio.create_task(_stop_when_orphaned(stop, signalled))
        try:
            await main(stop)
        finally:
            watch.cancel()

    finished = threading.Event()
    try:
        # Its own clean-up (tasks left, the default executor's threads) within the deadline too.
        with asyncio.Runner(loop_factory=event_loop_factory()) as loop_runner:
            loop_runner.run(runner())
    finally:
        finished.set()


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The loop `ConnectionSettings.event_loop` names (None: Python's own)."""
    return uvloop.new_event_loop if ConnectionSettings().event_loop == "uvloop" else None


async def _stop_when_orphaned(stop: asyncio.Event, stop_now: Callable[[], None]) -> None:
    """Started by its supervisor (`SUPERVISOR_PID` names this process's parent): once the supervisor is gone (killed
    outright, never stopping its children), stop as on SIGTERM rather than run on unsupervised. A process started by
    anything else (the variable inherited from elsewhere) is left alone."""
    supervisor = os.environ.get(SUPERVISOR_PID, "")
    if not supervisor.isdigit() or os.getppid() != int(supervisor):
        return
    while not stop.is_set():
        if os.getppid() != int(supervisor):
            logging.getLogger(__name__).warning("supervisor %s is gone; stopping", supervisor)
            stop_now()
            return
        await asyncio.sleep(SUPERVISOR_CHECK_S)


def run_service(name: str, log_level: str, main: Callable[[asyncio.Event], Awaitable[None]], *,
                metrics: tuple[str, int], native_stderr: bool = False) -> None:
    """What every service's `__main__` does: configure logging, then run until signalled. `native_stderr`: native
    libraries' stderr becomes log records too (the executor's engines)."""
    if native_stderr:
        capture_native_stderr()
    configure_observability(name, log_level, metrics)
    run_until_signalled(main)
