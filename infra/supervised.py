"""One process `sheshnag up` supervises: started in its own session with its log and pid file, restarted with
exponential backoff when it crashes (the crash logged), stopped within a grace; and a server started until it
listens."""

import contextlib
import logging
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from infra.embedded import stop_process, wait_for_port
from infra.private import PRIVATE_UMASK

log = logging.getLogger("sheshnag.up")

MAX_RESTART_DELAY_S = 30.0
STABLE_AFTER_S = 60.0
"""A service that ran this long before crashing restarts without delay growth."""


@dataclass
class Supervised:
    name: str
    command: list[str]
    env: dict[str, str] | None
    log_file: Path
    cwd: Path | None = None
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restarts: int = 0
    pid_written: bool = False
    next_start_at: float = 0.0
    delay_s: float = 1.0
    make_command: Callable[[], list[str]] | None = None
    """Builds the command afresh for each start (SeaweedFS: its inner servers' ports, picked free again, since
    another process may have taken one between the pick and the bind)."""

    def start(self) -> None:
        if self.make_command is not None:
            self.command = self.make_command()
        with self.log_file.open("ab") as out:
            # Own session: a Ctrl-C reaches only the supervisor, which then stops services before the broker.
            self.process = subprocess.Popen(self.command, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                            cwd=self.cwd, start_new_session=True, umask=PRIVATE_UMASK)
        self.started_at = time.monotonic()
        self.pid_written = False
        self.write_pid()

    def write_pid(self) -> None:
        """The running process's pid, for tools and tests; on a full disk it is written once there is room again
        (the process runs meanwhile: a supervisor that stopped for want of a pid file would stop the whole stack)."""
        if self.process is None or self.pid_written:
            return
        # Atomic: a reader never sees the file empty or half written.
        staging = self.pid_file.with_suffix(".pid.tmp")
        try:
            staging.write_text(str(self.process.pid))
            staging.replace(self.pid_file)
        except OSError as error:
            with contextlib.suppress(OSError):
                staging.unlink()
            log.warning("%s's pid file not written (%s); tried again next tick", self.name, error)
            return
        self.pid_written = True

    @property
    def pid_file(self) -> Path:
        return self.log_file.with_suffix(".pid")

    def check(self) -> None:
        """Restart a crashed process with exponential backoff, logging the crash. A start that fails (no room for
        its log, no process to be had) is tried again after the same backoff: the supervisor itself never stops."""
        now = time.monotonic()
        if self.process is None:
            if now >= self.next_start_at:
                self._try_start(now)
            return
        code = self.process.poll()
        if code is None:
            self.write_pid()
            return
        ran_for = now - self.started_at
        self.delay_s = 1.0 if ran_for > STABLE_AFTER_S else min(self.delay_s * 2, MAX_RESTART_DELAY_S)
        self.restarts += 1
        log.error("%s crashed with exit code %s after %.1fs; restart #%d in %.0fs (log: %s)",
                  self.name, code, ran_for, self.restarts, self.delay_s, self.log_file)
        self.process = None
        self.next_start_at = now + self.delay_s

    def _try_start(self, now: float) -> None:
        try:
            self.start()
        except OSError as error:
            self.process = None
            self.delay_s = min(self.delay_s * 2, MAX_RESTART_DELAY_S)
            self.next_start_at = now + self.delay_s
            log.error("%s could not be started (%s); tried again in %.0fs", self.name, error, self.delay_s)

    def stop(self, within_s: float = 10.0) -> None:
        if self.process is not None:
            stop_process(self.process, within_s)


START_TRIES = 3
"""Starts of a server whose command is built afresh each time (SeaweedFS) before its start-up failure is final."""


def start_until_listening(child: Supervised, port: int, ready_s: float, host: str, started: bool = False) -> None:
    """Start `child` (`started`: it was just started) and wait for it to listen; one that exits during start-up and
    builds its command afresh (an inner port another process took meanwhile: "Port allocation failed") is started
    again, up to START_TRIES."""
    for attempt in range(1, START_TRIES + 1):
        if not started or attempt > 1:
            child.start()
        assert child.process is not None
        try:
            wait_for_port(port, child.process, ready_s, child.name, host)
            return
        except RuntimeError as error:
            if child.make_command is None or attempt == START_TRIES:
                raise RuntimeError(f"{error}; the end of its log ({child.log_file}):\n{log_tail(child.log_file)}") \
                    from error
            log.warning("%s exited during start-up (try %d of %d; log: %s); starting it again on fresh ports",
                        child.name, attempt, START_TRIES, child.log_file)
            child.stop()


def log_tail(path: Path, lines: int = 20) -> str:
    """The last `lines` of a server's log, for the error that says it would not start ("" where it is unreadable)."""
    try:
        with path.open("rb") as log_file:
            log_file.seek(max(0, log_file.seek(0, 2) - 16_384))
            return b"\n".join(log_file.read().splitlines()[-lines:]).decode(errors="replace")
    except OSError:
        return ""
