"""A service process always stops on SIGTERM: cleanly when it can, at once when signalled again."""

import signal
import subprocess
import sys
import time

WEDGED_SERVICE = """
import asyncio, sys
from services.runtime.process.runner import run_until_signalled

async def main(stop):
    print("up", flush=True)
    await stop.wait()
    await asyncio.Event().wait()  # a clean stop that never ends (a request stuck on a dead store)

run_until_signalled(main)
"""


def test_a_service_whose_clean_stop_hangs_exits_on_a_second_sigterm() -> None:
    process = subprocess.Popen([sys.executable, "-c", WEDGED_SERVICE], stdout=subprocess.PIPE)
    assert process.stdout is not None and process.stdout.readline() == b"up\n"
    process.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert process.poll() is None  # still stopping cleanly
    process.send_signal(signal.SIGTERM)
    assert process.wait(10) == 1
