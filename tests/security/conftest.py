"""The attacks of the threat model (SECURITY.md), each run against a real stack as `sheshnag up` starts it.

The stack here keeps every default a deployment has (the brute-force limit on, unlike the e2e suite's), so an
attack that works against it works against an operator's stack too.
"""

from collections.abc import Iterator

import pytest

from infra.embedded import free_port
from tests.e2e.conftest import ADMIN_KEY, RunningStack, start_stack, stop_stack

__all__ = ["ADMIN_KEY", "RunningStack"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/security/" in str(item.fspath):
            item.add_marker(pytest.mark.security)


@pytest.fixture(scope="session")
def secure_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    """A stack on defaults, shared by the attack tests (each makes its own users and keys)."""
    running = start_stack(tmp_path_factory.mktemp("secure") / "data", free_port())
    yield running
    stop_stack(running)
