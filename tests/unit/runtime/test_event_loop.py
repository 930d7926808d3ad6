"""A service runs on uvloop unless `SHESHNAG_EVENT_LOOP` names Python's own loop, and stops cleanly on either."""

import os
import signal
import subprocess
import sys

import pytest

SAYS_ITS_LOOP = """
import asyncio
from services.runtime.process.runner import run_until_signalled

async def main(stop):
    print(type(asyncio.get_running_loop()).__module__, flush=True)
    await stop.wait()
    print("stopped", flush=True)

run_until_signalled(main)
"""


@pytest.mark.parametrize(("setting", "loop_module"), [(None, "uvloop"), ("asyncio", "asyncio.unix_events")])
def test_a_service_runs_on_the_loop_its_setting_names_and_stops_cleanly(setting: str | None, loop_module: str) -> None:
    env = {name: value for name, value in os.environ.items() if name != "SHESHNAG_EVENT_LOOP"}
    if setting is not None:
        env["SHESHNAG_EVENT_LOOP"] = setting
    process = subprocess.Popen([sys.executable, "-c", SAYS_ITS_LOOP], stdout=subprocess.PIPE, env=env)
    assert process.stdout is not None
    assert process.stdout.readline().decode().strip() == loop_module
    process.send_signal(signal.SIGTERM)
    assert process.stdout.readline() == b"stopped\n"
    assert process.wait(30) == 0
