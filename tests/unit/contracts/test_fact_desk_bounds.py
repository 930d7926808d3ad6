"""A log read's `after` is a stream sequence: the desk sends `after + 1` to the broker as 64-bit JSON, so a larger (or
negative) one is a malformed read, refused as such, never a traceback in the scheduler without an answer."""

import pytest
from pydantic import ValidationError

from contracts.fact_desk import MAX_SEQUENCE, LogRead


@pytest.mark.parametrize("after", [-1, -(2**63), MAX_SEQUENCE + 1, 2**64 + 5, 10**30])
def test_a_log_read_after_no_stream_sequence_is_malformed(after: int) -> None:
    with pytest.raises(ValidationError):
        LogRead(batch_id="b1", after=after)


@pytest.mark.parametrize("after", [0, 1, MAX_SEQUENCE])
def test_a_log_read_after_any_stream_sequence_is_taken(after: int) -> None:
    assert LogRead(batch_id="b1", after=after).after == after
