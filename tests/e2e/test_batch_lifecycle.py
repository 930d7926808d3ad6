"""Partial batches, cancel and expiry through every service, with every input line accounted for once."""

import json
import time
from collections.abc import Sequence

import openai
import pytest
from openai import OpenAI
from openai.types import Batch

from contracts.lifecycle import TERMINAL
from tests.e2e.conftest import RunningStack
from tests.factories import chat_line, long_lines, run_batch, upload, wait_until_done

pytestmark = pytest.mark.e2e


def accounted(client: OpenAI, batch: Batch, custom_ids: Sequence[str | None]) -> tuple[list[dict], list[dict]]:
    """Output + error lines: each input line exactly once, and the counts agree."""
    output = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()] \
        if batch.output_file_id else []
    errors = [json.loads(x) for x in client.files.content(batch.error_file_id).text.splitlines()] \
        if batch.error_file_id else []
    assert sorted(map(str, (line["custom_id"] for line in output + errors))) == sorted(map(str, custom_ids))
    counts = batch.request_counts
    assert counts is not None
    assert (counts.total, counts.completed, counts.failed) == (len(custom_ids), len(output), len(errors))
    return output, errors


def test_allow_partial_runs_the_valid_lines_and_files_the_refused_ones_with_their_codes(stack: RunningStack) -> None:
    client = stack.client()
    lines = [json.dumps(chat_line("good-1", "hi")).encode(), b"{not json",
             json.dumps(chat_line("bad-model", "hi", model="nope")).encode(),
             json.dumps(chat_line("good-2", "hello")).encode()]
    created = client.batches.create(input_file_id=upload(client, lines), endpoint="/v1/chat/completions",
                                    completion_window="24h", extra_body={"allow_partial": True})
    batch, _ = wait_until_done(client, created.id)
    assert batch.status == "completed", batch.model_dump()
    output, errors = accounted(client, batch, ["good-1", None, "bad-model", "good-2"])
    assert [line["custom_id"] for line in output] == ["good-1", "good-2"]
    assert [(line["custom_id"], line["error"]["code"]) for line in errors] == [
        (None, "invalid_json"), ("bad-model", "unsupported_model")]


def test_lines_no_stage_could_run_are_refused_at_validation_and_a_repeated_custom_id_keeps_its_first_line(
        stack: RunningStack) -> None:
    client = stack.client()
    image = chat_line("image", "hi")
    image["body"] = {**image["body"], "messages": [{"role": "user", "content": [  # type: ignore[dict-item]
        {"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": "data:,"}}]}]}
    deep = json.dumps(chat_line("deep", "hi")).encode().replace(b'"seed": 7', b'"seed": 7, "user": '
                                                                + b"[" * 1000 + b"]" * 1000)
    lines = [json.dumps(chat_line(custom_id, "hi")).encode() for custom_id in ("A", "B", "A")]
    lines += [json.dumps(image).encode(), deep, json.dumps(chat_line("C", "hi")).encode()]
    created = client.batches.create(input_file_id=upload(client, lines), endpoint="/v1/chat/completions",
                                    completion_window="24h", extra_body={"allow_partial": True})
    batch, _ = wait_until_done(client, created.id)
    assert batch.status == "completed", batch.model_dump()
    output, errors = accounted(client, batch, ["A", "B", "A", "image", "deep", "C"])
    assert [line["custom_id"] for line in output] == ["A", "B", "C"]
    assert [(line["custom_id"], line["error"]["code"]) for line in errors] == [
        ("A", "duplicate_custom_id"), ("image", "multimodal_unavailable"), ("deep", "nesting_too_deep")]


def test_cancelling_a_running_batch_keeps_what_ran_and_files_the_rest_as_batch_cancelled(
        stack: RunningStack) -> None:
    client = stack.client()
    ids = [f"c-{i}" for i in range(40)]
    created = client.batches.create(input_file_id=upload(client, long_lines(ids)), endpoint="/v1/chat/completions",
                                    completion_window="24h")
    deadline = time.monotonic() + 60
    while client.batches.retrieve(created.id).status != "in_progress" and time.monotonic() < deadline:
        time.sleep(0.1)
    cancelling = client.batches.cancel(created.id)
    assert cancelling.status in ("cancelling", "cancelled")
    batch, _ = wait_until_done(client, created.id)
    assert batch.status == "cancelled" and batch.cancelled_at is not None
    _, errors = accounted(client, batch, list(ids))
    assert errors and all(line["error"]["code"] == "batch_cancelled" for line in errors)
    with pytest.raises(openai.BadRequestError) as again:
        client.batches.cancel(created.id)
    assert again.value.code == "batch_not_cancellable"


def until_running(client: OpenAI, batch_id: str, lines_done: int = 0) -> None:
    """Until the batch runs (and has `lines_done` lines committed), or has ended."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        done = batch.request_counts.completed + batch.request_counts.failed if batch.request_counts else 0
        if batch.status in TERMINAL or (batch.status == "in_progress" and done >= lines_done):
            return
        time.sleep(0.01)


def cancel(client: OpenAI, batch_id: str) -> Batch | None:
    """The answer to a cancel: an accepted one is `cancelling` (or already `cancelled`) since `cancelling_at`;
    None when the batch was past the point of no return (400 `batch_not_cancellable`)."""
    try:
        answer = client.batches.cancel(batch_id)
    except openai.BadRequestError as refused:
        assert refused.code == "batch_not_cancellable"
        return None
    assert answer.status in ("cancelling", "cancelled") and answer.cancelling_at is not None, answer.model_dump()
    return answer


def test_every_accepted_cancel_of_a_one_line_batch_answers_cancelling_and_ends_cancelled(stack: RunningStack) -> None:
    """Raced right after create and while running, 16 times: a cancel the API accepted always ends `cancelled`
    (the line in the output file if it ran), and one it refused always ends `completed`."""
    client = stack.client()
    file_id = upload(client, [chat_line("only", "Say hi.")])
    ended = []
    for round_ in range(16):
        created = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                        completion_window="24h", metadata={"round": str(round_)})
        if round_ % 2:
            until_running(client, created.id)
        answer = cancel(client, created.id)
        batch, _ = wait_until_done(client, created.id)
        ended.append((answer is not None, batch.status))
        accounted(client, batch, ["only"])
    assert all(status == ("cancelled" if accepted else "completed") for accepted, status in ended), ended


@pytest.mark.parametrize("running", [False, True], ids=["right_after_create", "while_running"])
def test_a_cancel_of_a_20_line_batch_answers_cancelling_and_ends_cancelled_with_what_ran(
        stack: RunningStack, running: bool) -> None:
    client = stack.client()
    ids = [f"t-{i}" for i in range(20)]
    created = client.batches.create(input_file_id=upload(client, long_lines(ids)), endpoint="/v1/chat/completions",
                                    completion_window="24h")
    if running:
        until_running(client, created.id, lines_done=1)
    answer = cancel(client, created.id)
    assert answer is not None
    batch, _ = wait_until_done(client, created.id)
    assert batch.status == "cancelled" and batch.cancelling_at == answer.cancelling_at, batch.model_dump()
    output, errors = accounted(client, batch, ids)
    assert errors and all(line["error"]["code"] == "batch_cancelled" for line in errors)
    assert all(line["response"]["status_code"] == 200 for line in output)
    assert len(output) >= running, "the lines that finished before the cancel are in the output file"


def test_a_cancel_of_a_batch_past_the_point_of_no_return_is_refused(stack: RunningStack) -> None:
    client = stack.client()
    batch = run_batch(client, upload(client, [chat_line("done", "Say hi.")]))
    assert batch.status == "completed"
    with pytest.raises(openai.BadRequestError) as refused:
        client.batches.cancel(batch.id)
    assert refused.value.code == "batch_not_cancellable"
    assert client.batches.retrieve(batch.id).status == "completed"


def test_a_batch_that_outlives_its_completion_window_expires_with_every_line_accounted_for(
        stack: RunningStack) -> None:
    client = stack.client()
    ids = [f"x-{i}" for i in range(40)]
    created = client.batches.create(input_file_id=upload(client, long_lines(ids)), endpoint="/v1/chat/completions",
                                    completion_window="4s")  # type: ignore[arg-type]
    batch, _ = wait_until_done(client, created.id, timeout_s=90)
    assert batch.status == "expired" and batch.expired_at is not None, batch.model_dump()
    _, errors = accounted(client, batch, list(ids))
    assert errors and all(line["error"]["code"] == "batch_expired" for line in errors)


def test_a_held_batch_validates_then_waits_until_released(stack: RunningStack) -> None:
    client = stack.client()
    ids = ["h-1", "h-2"]
    file_id = upload(client, [json.dumps(chat_line(i, "hi")).encode() for i in ids])
    created = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h",
                                    extra_body={"hold": True})
    deadline = time.monotonic() + 30
    batch = client.batches.retrieve(created.id)
    while batch.status == "validating" and time.monotonic() < deadline:
        time.sleep(0.1)
        batch = client.batches.retrieve(created.id)
    time.sleep(3)  # a scheduler tick or three: a held batch must not start
    batch = client.batches.retrieve(created.id)
    assert batch.status == "validated" and batch.in_progress_at is None, batch.model_dump()
    assert "release" in (batch.model_dump().get("status_reason") or "")
    client.post(f"/batches/{created.id}/release", cast_to=object, body={})
    batch, _ = wait_until_done(client, created.id)
    assert batch.status == "completed"
    accounted(client, batch, ids)
    with pytest.raises(openai.BadRequestError) as again:
        client.post(f"/batches/{created.id}/release", cast_to=object, body={})
    assert again.value.code == "batch_not_held"
