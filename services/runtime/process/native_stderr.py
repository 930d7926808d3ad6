"""Native libraries' stderr (llama.cpp, CUDA, BLAS write to descriptor 2, past logging) as records of the `native`
logger: descriptor 2 becomes a pipe a daemon thread reads, which never stops reading (a full pipe would block the
engine's next write); `sys.stderr` and `faulthandler` keep the original descriptor, so a crash still leaves its
traceback."""

import faulthandler
import logging
import os
import re
import sys
import threading

LOGGER = "native"
MAX_LINE = 8192
"""A longer line is cut (a runaway native write never holds the log handler long)."""
LLAMA_LINE = re.compile(r"^(?:\d+\.\d+\.\d+\.\d+\s+)?([IWEDT])\s+(.*)$")
"""llama.cpp's log prefix: an uptime stamp (`4.21.371.872`) and a level letter."""
ANSI = re.compile(r"\x1b\[[0-9;]*m")
LEVELS = {"D": logging.DEBUG, "T": logging.DEBUG, "I": logging.INFO, "W": logging.WARNING, "E": logging.ERROR}


def record_of(line: str) -> tuple[int, str]:
    """A native line's level and message (llama.cpp's level letter where it has one, else INFO)."""
    text = ANSI.sub("", line).rstrip()[:MAX_LINE]
    matched = LLAMA_LINE.match(text)
    if matched is None:
        return logging.INFO, text
    return LEVELS[matched.group(1)], matched.group(2).strip()


def _pump(read_fd: int) -> None:
    log = logging.getLogger(LOGGER)
    with os.fdopen(read_fd, "rb", buffering=0) as pipe:
        pending = b""
        while chunk := pipe.read(65536):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                try:
                    if raw.strip():
                        log.log(*record_of(raw.decode("utf-8", "replace")))
                except Exception:  # a line that cannot be logged is dropped; the pipe is kept drained
                    continue


def capture() -> bool:
    """Route descriptor 2 into the log (call before logging is configured); False when stderr is a terminal (a
    person reading it wants it as it is) or descriptor 2 is not there."""
    try:
        if os.isatty(2):
            return False
        original = os.dup(2)
    except OSError:
        return False
    read_fd, write_fd = os.pipe()
    sys.stderr = os.fdopen(original, "w", buffering=1, encoding="utf-8", errors="replace")
    faulthandler.enable(file=sys.stderr)
    os.dup2(write_fd, 2)
    os.close(write_fd)
    threading.Thread(target=_pump, args=(read_fd,), name="native-stderr", daemon=True).start()
    return True
