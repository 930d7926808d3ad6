"""A batch's lifecycle as sets: which statuses have ended, may be cancelled or released, which run, and which
facts end a batch. Every service asks these sets; none keeps a list of its own."""

from typing import Final, Literal, get_args

from contracts.api.batch import BatchStatus
from contracts.events.batch import (
    BatchCancelled,
    BatchCompleted,
    BatchEvent,
    BatchExpired,
    BatchFailed,
    BatchValidationFailed,
)

ALL_STATUSES: Final[frozenset[BatchStatus]] = frozenset(get_args(BatchStatus))

EndReason = Literal["completed", "cancelled", "expired", "failed"]
"""Why a batch ends, as its finalizer is told and its files are written (a validation failure ends it before any
finalizer): the terminal statuses a finalize reaches."""

TERMINAL: Final[frozenset[BatchStatus]] = frozenset({"failed", "completed", "expired", "cancelled"})
"""Ended (OpenAI's terminal statuses): nothing more happens to the batch."""

UNFINISHED: Final[frozenset[BatchStatus]] = ALL_STATUSES - TERMINAL
"""Not ended yet, `cancelling` included: the batch counts against its owner's limit and holds its input file."""

RUNNING: Final[frozenset[BatchStatus]] = frozenset({"in_progress", "finalizing"})
"""An attempt runs the batch's lines or writes its files, and no cancel was asked (a cancel of a running batch
makes it `cancelling`, as in OpenAI's API)."""

IN_FLIGHT: Final[frozenset[BatchStatus]] = RUNNING | {"cancelling"}
"""Running, or winding down for a cancel: an attempt may still be at work and may still finish the batch."""

CANCELLABLE: Final[frozenset[BatchStatus]] = frozenset({"validating", "validated", "in_progress"})
"""A cancel may be asked: not once finalizing began (the files are being written), nor once ended. A batch
already `cancelling` is answered as it is."""

RELEASABLE: Final[frozenset[BatchStatus]] = frozenset({"validating", "validated"})
"""A held batch may be released until it runs (while `validating` the release waits for the verdict)."""

ENDING_FACTS: Final[tuple[type[BatchEvent], ...]] = (
    BatchValidationFailed, BatchFailed, BatchCompleted, BatchCancelled, BatchExpired)
"""The facts that end a batch, each making it `TERMINAL`; a batch has at most one."""

ENDING_FACT_NAMES: Final[frozenset[str]] = frozenset(fact.name for fact in ENDING_FACTS)
"""The event names (last subject token) of `ENDING_FACTS`."""
