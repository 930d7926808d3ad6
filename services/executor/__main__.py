"""`python -m services.executor`: run the executor until SIGINT/SIGTERM (or, with
`SHESHNAG_EXECUTOR_MAX_REFUSALS`, until refused that often: exit status 78)."""

from services.executor.adapters.refusals import EXIT_REFUSED, JoinRefused
from services.executor.app import run_executor
from services.executor.settings import ExecutorSettings
from services.runtime.process.runner import run_service


def main() -> None:
    settings = ExecutorSettings()
    try:
        run_service("executor", settings.connection.log_level, lambda stop: run_executor(settings, stop),
                    native_stderr=True, metrics=settings.metrics_endpoint())
    except JoinRefused:
        raise SystemExit(EXIT_REFUSED) from None  # the reason is the last line of its log


if __name__ == "__main__":
    main()
