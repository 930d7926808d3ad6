"""A service process always stops on SIGTERM: cleanly when it can, at once when signalled again; a stop it begins
itself (its broker connection closed for good) ends it too, within the clean stop's bound."""

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


STOPS_ITSELF = """
from services.runtime.process import runner

runner.STOP_GRACE_S = 1.0

async def main(stop):
    stop.set()  # as the broker's closed callback does
    while True:  # and the clean stop never ends: a task holding the event loop, never yielding
        pass

runner.run_until_signalled(main)
"""


def test_a_service_that_stops_itself_and_hangs_exits_once_its_clean_stop_is_overdue() -> None:
    """No signal comes: the supervisor restarts only a process that exits."""
    process = subprocess.run([sys.executable, "-c", STOPS_ITSELF], capture_output=True, timeout=60)
    assert process.returncode == 1, process.stderr[-2000:]


STOPS_CLEANLY_THEN_LIVES_ON = """
import time
from services.runtime.process import runner

runner.STOP_GRACE_S = 1.0

async def main(stop):
    stop.set()

runner.run_until_signalled(main)
time.sleep(3)  # past the grace: a clean stop's deadline is gone with it
print("alive", flush=True)
"""


def test_a_clean_stop_leaves_no_deadline_behind() -> None:
    process = subprocess.run([sys.executable, "-c", STOPS_CLEANLY_THEN_LIVES_ON], capture_output=True, timeout=60)
    assert (process.returncode, process.stdout) == (0, b"alive\n"), process.stderr[-2000:]
