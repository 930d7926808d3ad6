"""`sheshnag up` announces its stack (prints the admin key, writes the state file the tools read) only once the
gateway admits that key: a script that starts calling the moment `up` says the stack is up is never refused."""

from pathlib import Path

import httpx2
import pytest

from infra.embedded import free_port
from tests.e2e.conftest import ADMIN_KEY, start_stack, stop_stack

pytestmark = pytest.mark.e2e


def test_the_admin_key_works_the_moment_up_announces_the_stack(tmp_path: Path) -> None:
    stack = start_stack(tmp_path / "data", free_port())  # returns once the state file is written
    try:
        me = httpx2.get(f"http://127.0.0.1:{stack.port}/v1/me", headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                        timeout=30)
        assert me.status_code == 200, me.text
        assert me.json()["role"] == "admin"
    finally:
        stop_stack(stack)
