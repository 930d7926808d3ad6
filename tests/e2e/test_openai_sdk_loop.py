"""A user's unchanged OpenAI SDK code, against every service as its own process, on the real model."""

import io
import json
import time

import httpx2
import openai
import pytest
from openai.types import Batch

from tests.e2e.conftest import RunningStack
from tests.factories import chat_line, jsonl, wait_until_done

pytestmark = pytest.mark.e2e

def test_models_list_shows_the_default_catalogue_model(stack: RunningStack) -> None:
    ids = [model.id for model in stack.client().models.list()]
    assert "smollm2-135m-instruct-q4_1" in ids


def test_a_batch_runs_on_the_real_model_and_its_output_downloads(stack: RunningStack) -> None:
    client = stack.client()
    prompts = {"q-1": "Say hello.", "q/2 ünïcode": "Name a colour.", "q-3": "Count to three."}
    uploaded = client.files.create(file=jsonl([chat_line(c, p) for c, p in prompts.items()]), purpose="batch")
    assert client.files.retrieve(uploaded.id).filename == "requests.jsonl"

    created = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                    completion_window="24h", metadata={"project": "e2e"})
    # The create answers as OpenAI's does (and the seeds say): `validating`, even where validation is already done.
    lifecycle = ["validating", "validated", "in_progress", "finalizing", "completed"]
    assert created.status == "validating" and created.metadata == {"project": "e2e"}
    assert Batch.model_validate(created.model_dump()).status == "validating", "a status the SDK's own model takes"
    assert created._request_id is not None and created._request_id.startswith("req_"), "x-request-id on every answer"

    batch, polled = wait_until_done(client, created.id)
    assert batch.status == "completed", batch.model_dump()
    seen = [created.status, *polled]
    assert seen == sorted(seen, key=lifecycle.index), f"statuses went {seen}"
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (3, 3, 0)
    assert batch.model == "smollm2-135m-instruct-q4_1"
    assert batch.created_at <= batch.in_progress_at <= batch.finalizing_at <= batch.completed_at  # type: ignore[operator]
    assert batch.error_file_id is None and batch.output_file_id is not None

    lines = [json.loads(raw) for raw in client.files.content(batch.output_file_id).text.splitlines()]
    assert sorted(line["custom_id"] for line in lines) == sorted(prompts)
    for line in lines:
        assert line["id"].startswith("batch_req_") and line["error"] is None
        assert line["response"]["status_code"] == 200
        body = line["response"]["body"]
        assert body["object"] == "chat.completion" and body["model"] == "smollm2-135m-instruct-q4_1"
        assert body["choices"][0]["message"]["content"].strip()
        assert body["usage"]["completion_tokens"] > 0
    assert batch.usage is not None and batch.usage.output_tokens == sum(
        line["response"]["body"]["usage"]["completion_tokens"] for line in lines)


def test_a_file_with_bad_lines_fails_with_each_error_located(stack: RunningStack) -> None:
    client = stack.client()
    lines = [chat_line("a", "hi"), chat_line("a", "again"), chat_line("b", "hi", model="gpt-9")]
    content = io.BytesIO(b"".join(json.dumps(line).encode() + b"\n" for line in lines) + b'{"custom_id": \n')
    content.name = "bad.jsonl"
    uploaded = client.files.create(file=content, purpose="batch")
    created = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                    completion_window="24h")
    batch, _ = wait_until_done(client, created.id, timeout_s=60)
    assert batch.status == "failed"
    assert batch.errors is not None and batch.errors.data is not None
    found = {(error.code, error.line) for error in batch.errors.data}
    assert found == {("duplicate_custom_id", 2), ("unsupported_model", 3), ("invalid_json", 4)}
    assert all(error.message for error in batch.errors.data)


def test_the_batch_event_stream_replays_and_resumes_after_last_event_id(stack: RunningStack) -> None:
    client = stack.client()
    uploaded = client.files.create(file=jsonl([chat_line("only", "hi", model="nope")]), purpose="batch")
    created = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                    completion_window="24h")
    url = f"{stack.base_url}/batches/{created.id}/events"
    headers = {"Authorization": "Bearer gk-e2e-test-key"}
    with httpx2.stream("GET", url, headers=headers, timeout=60) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-accel-buffering"] == "no"
        frames = [f for f in response.read().decode().split("\n\n") if f.startswith("id:")]
    names = [frame.split("\n")[1].removeprefix("event: ") for frame in frames]
    assert [n for n in names if n != "batch.validation_progressed"] == [
        "batch.created", "batch.line_rejected", "batch.validation_failed"]
    first_id = frames[0].split("\n")[0].removeprefix("id: ")
    resumed = httpx2.get(url, headers={**headers, "Last-Event-ID": first_id}, timeout=60).text
    resumed_frames = [f for f in resumed.split("\n\n") if f.startswith("id:")]
    assert resumed_frames == frames[1:]


def test_bad_requests_get_openai_shaped_errors_never_a_500(stack: RunningStack) -> None:
    with pytest.raises(openai.AuthenticationError):
        stack.client(api_key="gk-wrong").models.list()
    client = stack.client()
    with pytest.raises(openai.NotFoundError) as missing:
        client.batches.retrieve("batch_doesnotexist")
    assert missing.value.body == {"message": "No batch found with id 'batch_doesnotexist'.",
                                  "type": "not_found_error", "param": None, "code": "not_found"}
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve("file-doesnotexist")
    uploaded = client.files.create(file=jsonl([chat_line("x", "hi")]), purpose="batch")
    with pytest.raises(openai.BadRequestError) as unsupported:
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/moderations",
                              completion_window="24h")
    assert unsupported.value.code == "unsupported_endpoint"
    raw = httpx2.post(f"{stack.base_url}/batches", content=b"{not json", timeout=10,
                      headers={"Authorization": "Bearer gk-e2e-test-key", "Content-Type": "application/json"})
    assert raw.status_code == 400 and raw.json()["error"]["code"] == "invalid_json"


def test_a_crashed_service_is_restarted_and_the_crash_is_logged(stack: RunningStack) -> None:
    import os
    import signal

    before = stack.service_pid("validator")
    os.kill(before, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and stack.service_pid("validator") == before:
        time.sleep(0.2)
    assert stack.service_pid("validator") != before
    up_log = (stack.data_dir.parent / f"up-{stack.port}.out").read_text()
    assert "validator crashed with exit code -9" in up_log
    client = stack.client()
    uploaded = client.files.create(file=jsonl([chat_line("after-crash", "hi", model="nope")]), purpose="batch")
    created = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                    completion_window="24h")
    assert wait_until_done(client, created.id, timeout_s=60)[0].status == "failed"


def test_uploads_that_are_not_jsonl_or_not_for_batches_are_refused(stack: RunningStack) -> None:
    client = stack.client()
    not_jsonl = io.BytesIO(b"custom_id,method\nx,POST\n")
    not_jsonl.name = "requests.csv"
    with pytest.raises(openai.BadRequestError) as refused:
        client.files.create(file=not_jsonl, purpose="batch")
    assert refused.value.code == "invalid_file_format"
    with pytest.raises(openai.BadRequestError) as wrong_purpose:
        client.files.create(file=jsonl([chat_line("x", "hi")]), purpose="fine-tune")
    assert wrong_purpose.value.code == "invalid_purpose"
    listed = [f.filename for f in client.files.list()]
    assert "requests.csv" not in listed
