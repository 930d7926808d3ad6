"""Subjects are spelled and read only by `contracts.subjects`: what each parser takes apart, and what it refuses."""

from typing import get_args

import pytest

from contracts.subjects import (
    AggregateKind,
    EventSubject,
    consumer_next,
    event_name_of,
    event_subject,
    finalize_command,
    object_requests,
    parse_event_subject,
    run_command,
    subject_pattern,
)


@pytest.mark.parametrize("kind", get_args(AggregateKind))
def test_an_event_subject_parses_back_into_what_spelled_it(kind: AggregateKind) -> None:
    assert parse_event_subject(event_subject(kind, "id_1-x", "some_fact")) == EventSubject(kind, "id_1-x", "some_fact")


@pytest.mark.parametrize("subject", [
    run_command("gpu-1"), object_requests("gpu-1"), "evt.batch.b1", "evt.batch.b1.created.more", "evt.nothing.b1.x",
    "evt.batch..created", "evt.batch.b1.", "nvt.batch.b1.created", "",
])
def test_anything_but_an_event_subject_parses_to_none(subject: str) -> None:
    assert parse_event_subject(subject) is None
    assert event_name_of(subject) is None


def test_the_event_name_is_the_subjects_last_token() -> None:
    assert event_name_of(event_subject("batch", "batch_1", "validation_failed")) == "validation_failed"


def test_a_span_name_keeps_the_subject_but_not_the_id_it_names() -> None:
    assert subject_pattern(event_subject("batch", "batch_1", "validated")) == "evt.batch.*.validated"
    assert subject_pattern(finalize_command("gpu-1")) == "cmd.executor.*.finalize"
    assert subject_pattern("svc.fleet.register") == "svc.fleet.register"


def test_a_pull_consumers_next_messages_are_asked_on_its_api_subject() -> None:
    assert consumer_next("EVENTS", "abc") == "$JS.API.CONSUMER.MSG.NEXT.EVENTS.abc"
