"""`python -m services.executor`: run the executor until SIGINT/SIGTERM."""

from services.executor.app import run_executor
from services.executor.settings import ExecutorSettings
from services.runtime.process import run_service


def main() -> None:
    settings = ExecutorSettings()
    run_service("executor", settings.connection.log_level, lambda stop: run_executor(settings, stop),
                native_stderr=True)


if __name__ == "__main__":
    main()
