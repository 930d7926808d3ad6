"""A fact the ledger's rules cannot fold: its rule raised (a fault of ours, or a fact no rule foresaw), not the
store. Such a fact is folded once more from the stored state; if it faults again it never will, and it is set aside
(`Quarantine`: linked in the hash chain, kept in the log, shown as an anomaly) so that one fact cannot stop the
ledger for every tenant. The store's failures are never set aside: they are retried, as before."""

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from eventsourcing.persistence import PersistenceError

from contracts.events.batch import ISSUE_MESSAGE_CHARS, clipped

log = logging.getLogger(__name__)

STORE_FAILURES: tuple[type[Exception], ...] = (PersistenceError, OSError, MemoryError)
"""The store's failures (and the machine's): passing, never the fact's."""
CONFIRM_AFTER_S = 0.5
"""A fault is confirmed (folded again from the stored state) this long after it was first seen."""


class FoldFault(Exception):
    """The rule folding the fact at `sequence` raised `cause` (`in_run`: while applying a run of merged progress
    facts, of which `sequence` is only the last)."""

    def __init__(self, sequence: int, cause: Exception, in_run: bool = False) -> None:
        super().__init__(f"folding sequence {sequence} raised {cause!r}")
        self.sequence = sequence
        self.cause = cause
        self.in_run = in_run


def blamed(sequence: int, error: Exception, in_run: bool = False) -> Exception:
    """What to raise for `error`, raised while folding the fact at `sequence`: a rule's exception named by that fact
    (`FoldFault`); the store's, or a fault already named, as it is."""
    return error if isinstance(error, (FoldFault, *STORE_FAILURES)) else FoldFault(sequence, error, in_run)


@contextmanager
def blamed_on(sequence: int, in_run: bool = False) -> Iterator[None]:
    """`blamed`, for what the block raises."""
    try:
        yield
    except Exception as error:
        raised = blamed(sequence, error, in_run)
        if raised is error:
            raise
        raise raised from error


@dataclass
class Quarantine:
    """The facts set aside, by stream sequence, each with why; and the fault seen last, not yet set aside."""

    reasons: dict[int, str] = field(default_factory=dict)
    unmerged: bool = False
    """Fold progress facts one at a time, not merged into runs, so that a fault names its own fact."""
    _suspect: int | None = None

    def __contains__(self, sequence: int) -> bool:
        return sequence in self.reasons

    def folded(self) -> None:
        """A group folded: the next merges its progress facts again."""
        self.unmerged = False
        self._suspect = None

    def forget_through(self, sequence: int) -> None:
        """The facts through `sequence` are folded for good: their reasons are no longer needed."""
        for set_aside in [each for each in self.reasons if each <= sequence]:
            del self.reasons[set_aside]

    def judge(self, fault: FoldFault) -> None:
        """A first fault of a fact is tried again (from the stored state, after `CONFIRM_AFTER_S`); a second sets it
        aside. A fault in a run of progress facts first has the group folded again with each applied alone."""
        if fault.in_run and not self.unmerged:
            self.unmerged = True
            log.warning("%s, the last of a run of progress facts; folding its group again fact by fact", fault)
            return
        if fault.sequence != self._suspect:
            self._suspect = fault.sequence
            log.warning("%s; folding its group again from the stored state", fault)
            time.sleep(CONFIRM_AFTER_S)
            return
        self._suspect = None
        self.reasons[fault.sequence] = clipped(f"it could not be folded: {fault.cause!r}", ISSUE_MESSAGE_CHARS)
        log.error("%s twice: set aside (an anomaly); the facts after it fold as usual", fault,
                  exc_info=fault.cause)
