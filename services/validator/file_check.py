"""Checking a whole file in one thread: lines read, each window planned, checked (here or in worker processes) and
put through the file's rules in line order, its findings handed on as soon as known. One thread reads and checks:
on one core, a thread handing work to another through the event loop waits for the interpreter lock each time."""

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field

from contracts.api.rejected_line import RejectedLine
from services.validator.adapters.check_pool import CheckPool
from services.validator.domain import FileValidation, LineResult, Window
from services.validator.line_checks import WireVerdict, check_lines
from services.validator.refusals import rejected_line
from services.validator.rules import LineVerdict

WINDOW_LINES = 256
"""Lines checked together; their prompts are counted in one tokenizer batch."""
HAND_OVER_EVERY_S = 0.1
"""Findings are handed on at most this often (the first at once): each hand-over wakes the event loop."""
WORKER_QUEUE = 2
"""Windows each worker holds (one checked, one waiting): this thread checks one itself only when all are full."""


class Stopped(Exception):
    """The validation was called off (cancelled) while its file was being checked."""


@dataclass(frozen=True)
class Findings:
    """What one window added: its refused lines (with their issues), and the file's counts after it."""

    refused: list[tuple[LineResult, RejectedLine]]
    """Each refused line's result and record (built here, off the event loop)."""
    lines_read: int
    errors_found: int


Sent = tuple[Window, "Future[list[WireVerdict | None]] | list[LineVerdict | None]"]
"""A window and its verdicts: known already (checked here), or to come from a worker."""


@dataclass
class FileCheck:
    validation: FileValidation
    found: Callable[[Findings], None]
    """Called (in this thread) after each window with what it found."""
    stopped: threading.Event
    pool: CheckPool | None = None
    in_flight: deque[Sent] = field(default_factory=deque, init=False)
    refused: list[tuple[LineResult, RejectedLine]] = field(default_factory=list, init=False)
    """Refused lines not handed on yet."""
    handed_at: float = field(default=-HAND_OVER_EVERY_S, init=False)

    def run(self, chunks: Iterable[list[bytes]]) -> None:
        """Check every line of `chunks` (the file's lines, in order), in windows of `WINDOW_LINES`."""
        window: list[tuple[int, bytes]] = []
        number = 0
        for lines in chunks:
            window += enumerate(lines, number + 1)
            number += len(lines)
            while len(window) >= WINDOW_LINES:
                self.send(window[:WINDOW_LINES])
                del window[:WINDOW_LINES]
        self.send(window)
        while self.in_flight:
            self.receive()
        self.hand_over()

    def send(self, lines: list[tuple[int, bytes]]) -> None:
        """Check a window: here, or in a worker while earlier windows are checked; results are applied in order."""
        if self.stopped.is_set():
            raise Stopped
        if not lines:
            return
        validation, pool = self.validation, self.pool
        queued = pool.processes * WORKER_QUEUE if pool is not None else 0
        # Lines that take an earlier line's model wait for every earlier window: it may name the model.
        while self.in_flight and (validation.awaits_line_model or len(self.in_flight) > queued):
            self.receive()
        window = validation.plan(lines)
        in_workers = sum(1 for _, verdicts in self.in_flight if isinstance(verdicts, Future))
        if pool is None or validation.awaits_line_model or in_workers >= queued:
            self.in_flight.append((window, check_lines(window.to_check, window.spec, validation.catalogue,
                                                       validation.tokenizers)))
        else:
            self.in_flight.append((window, pool.submit(window.spec, window.to_check)))
        while self.in_flight and (not isinstance(done := self.in_flight[0][1], Future) or done.done()):
            self.receive()

    def receive(self) -> None:
        """Apply the oldest window's verdicts (waiting for its worker) and hand on what it found."""
        window, verdicts = self.in_flight.popleft()
        if isinstance(verdicts, Future):
            assert self.pool is not None
            verdicts = self.pool.verdicts(verdicts, window.spec, window.to_check, self.validation.catalogue,
                                          self.validation.tokenizers)
        self.refused += ((result, rejected_line(result)) for result in self.validation.refused(window, verdicts))
        if time.monotonic() - self.handed_at >= HAND_OVER_EVERY_S:
            self.hand_over()

    def hand_over(self) -> None:
        self.handed_at = time.monotonic()
        validation = self.validation
        self.found(Findings(self.refused, validation.total_lines, validation.error_count))
        self.refused = []
