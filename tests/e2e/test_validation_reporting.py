"""How validation reports to people: the 100-error cap with true totals, grouped errors with fixes, limits."""

import io
import json

import httpx2
import openai
import pytest

from tests.e2e.conftest import ADMIN_KEY, E2E_UPLOAD_LIMIT, RunningStack
from tests.factories import chat_line, wait_until_done

pytestmark = pytest.mark.e2e
AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}


def upload(stack: RunningStack, content: bytes) -> str:
    buffer = io.BytesIO(content)
    buffer.name = "input.jsonl"
    return stack.client().files.create(file=buffer, purpose="batch").id


def test_a_file_with_150_errors_keeps_100_and_reports_the_true_total_per_code(stack: RunningStack) -> None:
    lines = [json.dumps(chat_line(f"ok-{i}", "hi")) for i in range(10)]
    lines += ["{broken"] * 120
    lines += [json.dumps(chat_line(f"bad-model-{i}", "hi", model="nope")) for i in range(30)]
    client = stack.client()
    created = client.batches.create(input_file_id=upload(stack, "\n".join(lines).encode()),
                                    endpoint="/v1/chat/completions", completion_window="24h")
    batch, _ = wait_until_done(client, created.id, timeout_s=60)
    assert batch.status == "failed"
    raw = httpx2.get(f"{stack.base_url}/batches/{batch.id}", headers=AUTH, timeout=10).json()
    assert len(raw["errors"]["data"]) == 100
    assert raw["errors"]["total"] == 150
    assert raw["errors"]["counts_by_code"] == {"invalid_json": 120, "unsupported_model": 30}
    assert raw["request_counts"] == {"total": 160, "completed": 0, "failed": 160}
    assert raw["status_reason"] == "150 of 160 input lines failed validation."
    error_file = [json.loads(line) for line in client.files.content(raw["error_file_id"]).text.splitlines()]
    assert len(error_file) == 160, "every input line is in the error file, beyond the 100 errors kept"
    codes = [line["error"]["code"] for line in error_file]
    assert (codes.count("invalid_json"), codes.count("unsupported_model")) == (120, 30)
    assert codes.count("batch_failed_validation") == 10

    summary = httpx2.get(f"{stack.base_url}/batches/{batch.id}/errors", headers=AUTH, timeout=10).json()
    assert summary["total"] == 150
    groups = {group["code"]: group for group in summary["groups"]}
    assert groups["invalid_json"]["count"] == 120 and groups["invalid_json"]["lines"] == [11, 12, 13, 14, 15]
    assert groups["unsupported_model"]["count"] == 30 and groups["unsupported_model"]["param"] == "body.model"
    assert groups["unsupported_model"]["lines"] == [131, 132, 133, 134, 135]
    assert all(group["fix"] and group["title"] for group in summary["groups"])
    # The failed lines the status line counts are the error file's, by code and why: the two always agree.
    assert summary["failed_lines"] == raw["request_counts"]["failed"] == 160
    assert {(g["code"], g["stage"]): g["count"] for g in summary["failed_by_code"]} == {
        ("invalid_json", "refused"): 120, ("unsupported_model", "refused"): 30,
        ("batch_failed_validation", "not_run"): 10}


def test_allow_partial_reports_the_true_error_totals_past_100_per_code(stack: RunningStack) -> None:
    lines = [json.dumps(chat_line("ok", "hi")), *["{broken"] * 150]
    client = stack.client()
    created = client.batches.create(input_file_id=upload(stack, "\n".join(lines).encode()),
                                    endpoint="/v1/chat/completions", completion_window="24h",
                                    extra_body={"allow_partial": True})
    batch, _ = wait_until_done(client, created.id)
    assert batch.status == "completed", batch.model_dump()
    raw = httpx2.get(f"{stack.base_url}/batches/{batch.id}", headers=AUTH, timeout=10).json()
    assert (raw["errors"]["total"], raw["errors"]["counts_by_code"]) == (150, {"invalid_json": 150})
    assert len(raw["errors"]["data"]) == 100
    assert raw["request_counts"] == {"total": 151, "completed": 1, "failed": 150}
    summary = httpx2.get(f"{stack.base_url}/batches/{batch.id}/errors", headers=AUTH, timeout=10).json()
    assert summary["failed_lines"] == 150
    assert summary["failed_by_code"] == [{"code": "invalid_json", "stage": "refused", "count": 150,
                                          "title": summary["groups"][0]["title"]}]


def test_a_running_batch_has_no_failed_line_count_yet(stack: RunningStack) -> None:
    client = stack.client()
    created = client.batches.create(input_file_id=upload(stack, json.dumps(chat_line("slow", "hi")).encode()),
                                    endpoint="/v1/chat/completions", completion_window="24h",
                                    extra_body={"hold": True})
    summary = httpx2.get(f"{stack.base_url}/batches/{created.id}/errors", headers=AUTH, timeout=10).json()
    assert (summary["failed_lines"], summary["failed_by_code"]) == (None, [])
    client.batches.cancel(created.id)


def test_uploads_past_the_limit_are_refused_with_413_file_too_large(stack: RunningStack) -> None:
    line = json.dumps(chat_line("x", "y" * 1000)).encode() + b"\n"
    with pytest.raises(openai.APIStatusError) as refused:
        upload(stack, line * (E2E_UPLOAD_LIMIT // len(line) + 10))
    assert refused.value.status_code == 413
    assert refused.value.code == "file_too_large"


def test_the_event_stream_shows_validation_progress_before_the_verdict(stack: RunningStack) -> None:
    client = stack.client()
    created = client.batches.create(input_file_id=upload(stack, json.dumps(chat_line("a", "hi")).encode()),
                                    endpoint="/v1/chat/completions", completion_window="24h")
    wait_until_done(client, created.id)
    text = httpx2.get(f"{stack.base_url}/batches/{created.id}/events", headers=AUTH, timeout=30).text
    names = [line.removeprefix("event: ") for line in text.splitlines() if line.startswith("event: ")]
    assert names.index("batch.validation_progressed") < names.index("batch.validated")
    assert names[-1] == "batch.completed"
