"""`up`'s start: a port it is told to use that another program holds is said at once, before anything starts, and a
stop (Ctrl-C, SIGTERM) during its waits for the gateway ends them at once."""

import asyncio
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from infra.embedded import free_port
from infra.up import until_stopped


@pytest.mark.parametrize("option", ["--port", "--s3-port", "--nats-port"])
def test_a_port_another_program_holds_is_refused_at_once_and_nothing_starts(tmp_path: Path, option: str) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))  # a port the system gives: one drawn free may be taken before the bind
        holder.listen()
        held = holder.getsockname()[1]
        ports = {"--port": free_port(), "--s3-port": free_port(), "--nats-port": free_port(), option: held}
        done = subprocess.run([sys.executable, "-m", "infra.cli", "up", "--data-dir", str(tmp_path / "data"),
                               *(str(part) for pair in ports.items() for part in pair)],
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert f"port {held} on 127.0.0.1" in done.stderr and f"choose another with {option}" in done.stderr
    assert not (tmp_path / "data").exists()


async def test_a_stop_ends_a_start_up_wait_at_once() -> None:
    stop = asyncio.Event()

    async def never_answered() -> None:
        await asyncio.Event().wait()

    asyncio.get_running_loop().call_later(0.1, stop.set)
    assert await asyncio.wait_for(until_stopped(never_answered(), stop), 10) is False


async def test_a_start_up_wait_that_ends_or_fails_is_its_own_answer() -> None:
    async def answered() -> None:
        await asyncio.sleep(0)

    async def gave_up() -> None:
        raise TimeoutError("the gateway did not answer")

    assert await until_stopped(answered(), asyncio.Event()) is True
    with pytest.raises(TimeoutError, match="did not answer"):
        await until_stopped(gave_up(), asyncio.Event())
