"""Logging what an untrusted party sent that was skipped or refused, at most once a minute per source: a hostile
executor writing garbage every few milliseconds must not fill the log either (nor choose much of its text)."""

import logging
import time
from dataclasses import dataclass, field

QUIET_S = 60.0
MAX_SOURCES = 10_000
"""Sources remembered at once; past it the oldest are forgotten (a flood of made-up ids stays bounded)."""


@dataclass
class SkipLog:
    log: logging.Logger
    verb: str = "skipped"
    """How the log line says what was done with it (`skipped`, `refused`)."""
    quiet_s: float = QUIET_S
    _last: dict[str, float] = field(default_factory=dict)
    _skipped: dict[str, int] = field(default_factory=dict)

    def skipped(self, source: str, what: str) -> None:
        """`what` from `source` was skipped: logged now, or counted into the next line for that source."""
        now = time.monotonic()
        last = self._last.get(source)
        if last is not None and now - last < self.quiet_s:
            self._skipped[source] = self._skipped.get(source, 0) + 1
            return
        more = self._skipped.pop(source, 0)
        if len(self._last) >= MAX_SOURCES:
            for oldest in sorted(self._last, key=self._last.__getitem__)[:MAX_SOURCES // 10]:
                self._last.pop(oldest, None)
                self._skipped.pop(oldest, None)
        self._last[source] = now
        self.log.warning("%s from %s: %s%s", self.verb, source[:80], what[:300],
                         f" (and {more} more {self.verb} in the last {self.quiet_s:.0f}s)" if more else "")
