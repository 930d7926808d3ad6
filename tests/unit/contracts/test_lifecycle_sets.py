"""The lifecycle sets every service asks: what has ended, what runs, what may be cancelled or released."""

from typing import get_args

from contracts.api.batch import BatchStatus
from contracts.api.batch_event import BatchEventType
from contracts.lifecycle import (
    ALL_STATUSES,
    CANCELLABLE,
    ENDING_FACT_NAMES,
    ENDING_FACTS,
    IN_FLIGHT,
    RELEASABLE,
    RUNNING,
    TERMINAL,
    UNFINISHED,
)


def test_every_status_has_either_ended_or_not_never_both() -> None:
    assert set(ALL_STATUSES) == set(get_args(BatchStatus))
    assert TERMINAL | UNFINISHED == ALL_STATUSES
    assert not TERMINAL & UNFINISHED


def test_the_terminal_statuses_are_openais() -> None:
    assert {"completed", "failed", "expired", "cancelled"} == TERMINAL


def test_a_running_batch_has_an_attempt_at_work_and_no_cancel_asked() -> None:
    assert {"in_progress", "finalizing"} == RUNNING
    assert IN_FLIGHT - RUNNING == {"cancelling"}
    assert not IN_FLIGHT & {"validating", "validated"}
    assert IN_FLIGHT <= UNFINISHED


def test_a_batch_may_be_cancelled_until_its_files_are_being_written() -> None:
    assert {"validating", "validated", "in_progress"} == CANCELLABLE
    assert CANCELLABLE <= UNFINISHED
    assert "finalizing" not in CANCELLABLE
    assert "cancelling" not in CANCELLABLE


def test_a_held_batch_may_be_released_only_before_it_runs() -> None:
    assert {"validating", "validated"} == RELEASABLE
    assert not RELEASABLE & (IN_FLIGHT | TERMINAL)


def test_the_ending_facts_are_the_public_stream_types_that_end_it() -> None:
    names = {fact.name for fact in ENDING_FACTS}
    assert names == ENDING_FACT_NAMES == {"validation_failed", "failed", "completed", "cancelled", "expired"}
    assert {f"batch.{name}" for name in names} <= set(get_args(BatchEventType))
