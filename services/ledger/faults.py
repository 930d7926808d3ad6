"""A fact the ledger's rules cannot fold: its rule raised (a fault of ours, or a fact no rule foresaw), not the
store. Such a fact is folded once more from the stored state; if it faults again it never will, and it is set aside
(`Quarantine`: linked in the hash chain, kept in the log, shown as an anomaly) so that one fact cannot stop the
ledger for every tenant. The store's failures are never set aside: they are retried, as before."""

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from eventsourcing.persistence import PersistenceError

from contracts.events.batch import ISSUE_MESSAGE_CHARS, clipped

log = logging.getLogger(__name__)

STORE_FAILURES: tuple[type[Exception], ...] = (PersistenceError, OSError)
"""The store's failures (and the machine's): passing, never the fact's."""


class FoldFault(Exception):
    """The rule folding the fact at `sequence` raised `cause`."""

    def __init__(self, sequence: int, cause: Exception) -> None:
        super().__init__(f"folding sequence {sequence} raised {cause!r}")
        self.sequence = sequence
        self.cause = cause


def blamed(sequence: int, error: Exception) -> Exception:
    """What to raise for `error`, raised while folding the fact at `sequence`: a rule's exception named by that fact
    (`FoldFault`); the store's, or a fault already named, as it is."""
    return error if isinstance(error, (FoldFault, *STORE_FAILURES)) else FoldFault(sequence, error)


@contextmanager
def blamed_on(sequence: int) -> Iterator[None]:
    """`blamed`, for what the block raises."""
    try:
        yield
    except Exception as error:
        raised = blamed(sequence, error)
        if raised is error:
            raise
        raise raised from error


@dataclass
class Quarantine:
    """The facts set aside, by stream sequence, each with why; and the fault seen last, not yet set aside."""

    reasons: dict[int, str] = field(default_factory=dict)
    _suspect: int | None = None

    def __contains__(self, sequence: int) -> bool:
        return sequence in self.reasons

    def forget_through(self, sequence: int) -> None:
        """The facts through `sequence` are folded for good: their reasons are no longer needed."""
        for set_aside in [each for each in self.reasons if each <= sequence]:
            del self.reasons[set_aside]

    def judge(self, fault: FoldFault) -> None:
        """A first fault of a fact is tried again (from the stored state); a second sets it aside."""
        if fault.sequence != self._suspect:
            self._suspect = fault.sequence
            log.warning("%s; folding its group again from the stored state", fault)
            return
        self._suspect = None
        self.reasons[fault.sequence] = clipped(f"it could not be folded: {fault.cause!r}", ISSUE_MESSAGE_CHARS)
        log.error("%s twice: set aside (an anomaly); the facts after it fold as usual", fault,
                  exc_info=fault.cause)
