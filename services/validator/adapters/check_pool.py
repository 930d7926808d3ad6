"""Worker processes that check windows of lines (`line_checks.check_lines`), each with the catalogue and its own
tokenizers: a window goes out as bytes and comes back as small verdicts, sent and collected by the file's checking
thread (never the event loop). A dead worker breaks the pool: its window is checked here, and a new pool starts."""

import logging
import multiprocessing
import multiprocessing.connection
import os
import threading
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from contracts.catalogue import Catalogue
from services.validator.adapters.tokenizer import TokenizerCache
from services.validator.line_checks import WindowSpec, WireVerdict, check_lines, from_wire, to_wire
from services.validator.rules import LineVerdict

log = logging.getLogger(__name__)

_catalogue: Catalogue | None = None
_tokenizers: TokenizerCache | None = None
_restricted: dict[tuple[str, ...] | None, Catalogue] = {}


def _exit_with_parent() -> None:
    """End this worker when the validator that started it is gone, even SIGKILLed (nothing else would: a worker
    waiting for its next window never learns that its parent died, and would live on)."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _start_worker(catalogue_json: str, count_tokens: bool) -> None:
    global _catalogue, _tokenizers
    _exit_with_parent()
    _catalogue = Catalogue.model_validate_json(catalogue_json)
    _tokenizers = TokenizerCache() if count_tokens else None
    if _tokenizers is not None:
        for model in _catalogue.models:
            _tokenizers.get(model)


def _check_in_worker(spec: WindowSpec, lines: list[bytes | None]) -> list[WireVerdict | None]:
    assert _catalogue is not None
    catalogue = _restricted.get(spec.allowed_models)
    if catalogue is None:
        allowed = None if spec.allowed_models is None else list(spec.allowed_models)
        catalogue = _restricted[spec.allowed_models] = _catalogue.restricted_to(allowed)
    return [to_wire(verdict) for verdict in check_lines(lines, spec, catalogue, _tokenizers)]


class CheckPool:
    """`processes` workers (spawned: this process has threads, which a fork would copy half-way)."""

    def __init__(self, catalogue: Catalogue, processes: int, count_tokens: bool = True) -> None:
        self.catalogue, self.processes, self.count_tokens = catalogue, processes, count_tokens
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.processes, multiprocessing.get_context("spawn"),
                                             initializer=_start_worker,
                                             initargs=(self.catalogue.model_dump_json(), self.count_tokens))
        return self._pool

    def warm_up(self) -> None:
        """Start the workers now (they load the tokenizers), not on the first file."""
        pool = self._executor()
        for future in [pool.submit(int) for _ in range(self.processes)]:
            future.result()

    def submit(self, spec: WindowSpec, lines: list[bytes | None]) -> "Future[list[WireVerdict | None]]":
        """Send a window to a worker; its verdicts come back through `verdicts`."""
        try:
            return self._executor().submit(_check_in_worker, spec, lines)
        except BrokenProcessPool as error:
            broken: Future[list[WireVerdict | None]] = Future()
            broken.set_exception(error)
            return broken

    def verdicts(self, sent: "Future[list[WireVerdict | None]]", spec: WindowSpec, lines: list[bytes | None],
                 catalogue: Catalogue, tokenizers: TokenizerCache | None) -> list[LineVerdict | None]:
        """A sent window's verdicts (blocking); checked in this thread if the pool broke (it starts again next)."""
        try:
            wires = sent.result()
        except BrokenProcessPool:
            log.warning("a line-checking worker died; this window is checked here, and the workers start again")
            self.close()
            return check_lines(lines, spec, catalogue, tokenizers)
        return [from_wire(wire, catalogue) for wire in wires]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
