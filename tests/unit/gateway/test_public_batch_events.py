"""The SSE payload is the public `BatchStreamEvent`: every batch fact maps to it, and nothing internal leaks."""

import json
import typing

import pytest

from contracts.api.batch import BatchUsage
from contracts.api.batch_event import EVENT_FIELDS, BatchEventType, BatchStreamEvent
from contracts.events.batch import BatchAssigned, BatchCompleted, BatchEvent, BatchProgressed
from contracts.events.registry import AnyEvent
from contracts.terms import TERM_FIELDS, WithTerms
from services.gateway.http.event_frames import public_event, sse_frame
from tests.factories import batch_created

INTERNAL_FIELDS = {"owner_key_id", "input_object_key", "allowed_models", "lease_token", "chunk_key",
                   "rejections_object_key", "requested_by_key_id", "released_by_key_id", "shard_span", "event_id",
                   "causation_id", "correlation_id", "version", "aggregate_id"}


def batch_fact_classes() -> list[type[BatchEvent]]:
    union = typing.get_args(typing.get_args(AnyEvent)[0])
    return [cls for cls in union if issubclass(cls, BatchEvent)]


def test_every_batch_fact_has_a_public_shape_made_of_fields_it_carries() -> None:
    types = set(typing.get_args(BatchEventType))
    for cls in batch_fact_classes():
        event_type = cls.model_fields["type"].default
        assert event_type in types, f"{event_type} has no public shape"
        carried = set(cls.model_fields) | (set(TERM_FIELDS) if issubclass(cls, WithTerms) else set())
        assert set(EVENT_FIELDS[event_type]) <= carried, event_type
        assert set(EVENT_FIELDS[event_type]) <= set(BatchStreamEvent.model_fields), event_type
    assert set(EVENT_FIELDS) == types


def test_the_public_shape_has_no_internal_field() -> None:
    assert not INTERNAL_FIELDS & set(BatchStreamEvent.model_fields)


@pytest.mark.parametrize("fact", [
    batch_created("batch_1", "key_owner", "files/file-1", created_at=1, expires_at=2, allowed_models=["smollm2"],
                  metadata={"project": "x"}),
    BatchAssigned(aggregate_id="batch_1", executor_id="gpu-7", attempt=2, lease_token="secret-lease", shards=2,
                  shard_span=100),
    BatchProgressed(aggregate_id="batch_1", attempt=2, chunk=3, chunk_key="results/batch_1/attempt-2/3.jsonl",
                    completed=10, failed=1),
])
def test_a_fact_shown_on_the_stream_keeps_its_public_fields_and_drops_the_internal_ones(fact: BatchEvent) -> None:
    frame = sse_frame(42, fact.model_dump_json().encode())
    assert frame is not None
    lines = frame.decode().split("\n")
    assert lines[:2] == ["id: 42", f"event: {fact.type}"] and lines[-2:] == ["", ""]
    data = json.loads(lines[2].removeprefix("data: "))
    assert set(data) == {"type", "batch_id", "occurred_at", *EVENT_FIELDS[fact.type]}  # type: ignore[index]
    assert data["batch_id"] == "batch_1" and data["occurred_at"] == fact.occurred_at
    assert not INTERNAL_FIELDS & set(data)
    assert "secret-lease" not in frame.decode() and "files/file-1" not in frame.decode()


def test_fields_a_type_carries_stay_even_when_null() -> None:
    ended = BatchCompleted(aggregate_id="batch_1", output_file_id=None, error_file_id="file-err", completed=0,
                           failed=3, usage=BatchUsage())
    shown = public_event(ended)
    assert shown is not None
    assert shown.model_dump(exclude_unset=True)["output_file_id"] is None


def test_a_fact_that_does_not_decode_is_left_out_of_the_stream() -> None:
    assert sse_frame(7, b'{"type": "batch.from_the_future", "aggregate_id": "batch_1"}') is None
