"""What native code writes to stderr reaches the log as JSON records (llama.cpp's level letters kept as levels), and
nothing of it interleaves with the log as plain text."""

import json
import logging
import subprocess
import sys

from services.runtime.process.native_stderr import record_of

CHILD = r"""
import ctypes, logging, os, sys
from services.runtime.process.native_stderr import capture
from services.runtime.process.runner import configure_logging
assert capture()
configure_logging("executor", "DEBUG")
os.write(2, b"4.21.371.872 W srv  load_model: the context is short\n")
libc = ctypes.CDLL(None)
libc.dprintf(2, b"\x1b[33m4.21.380.001 E srv  decode: out of slots\x1b[0m\nplain native text\n")
logging.getLogger("services.executor").info("a Python record")
import time; time.sleep(0.5)
"""


def test_llama_cpp_lines_keep_their_level_and_lose_their_prefix() -> None:
    assert record_of("4.21.371.872 W srv  load_model: short\n") == (logging.WARNING, "srv  load_model: short")
    assert record_of("\x1b[31m0.00.000.001 E fail\x1b[0m") == (logging.ERROR, "fail")
    assert record_of("ggml_cuda_init: found 1 CUDA device") == (logging.INFO, "ggml_cuda_init: found 1 CUDA device")


def test_a_process_s_native_stderr_becomes_json_records() -> None:
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stderr.splitlines()]  # every line is JSON
    native = [(r["level"], r["message"]) for r in records if r["logger"] == "native"]
    assert native == [("WARNING", "srv  load_model: the context is short"), ("ERROR", "srv  decode: out of slots"),
                      ("INFO", "plain native text")]
    assert any(r["logger"] == "services.executor" and r["message"] == "a Python record" for r in records)
    assert all(r["service"] == "executor" and r["time"].endswith("Z") for r in records)
