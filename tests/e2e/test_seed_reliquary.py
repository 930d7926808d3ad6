"""The Reliquary seed's walkthrough (batch_openai.py), run as written with only the base URL, key and model changed:
lines with the same sampling and `chat_template_kwargs: {"enable_thinking": false}`, a batch created with
`metadata.revision` (this deployment's revision of the model, as GET /v1/models shows it) and `metadata.max_price_usd`
and an Idempotency-Key; then its `n` samples, the same on every run of the same file. The script polls every minute;
this test every second."""

import io
import json
import time
import uuid
from typing import Any

import pytest
from openai import OpenAI
from openai.types import Batch

from tests.e2e.conftest import ADMIN_KEY, RunningStack

pytestmark = pytest.mark.e2e

MODEL = "smollm2"  # the walkthrough's "Qwen/Qwen3-8B"
TERMINAL = ("completed", "expired", "cancelled", "failed")


def line(custom_id: str, question: str, **sampling: object) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": MODEL, "messages": [{"role": "user", "content": question}], "max_tokens": 64, "temperature": 0.6,
        "top_p": 0.95, "top_k": 20, "seed": 7, "chat_template_kwargs": {"enable_thinking": False}, **sampling}}


def run(client: OpenAI, rows: list[dict[str, Any]], metadata: dict[str, str]) -> Batch:
    content = "".join(json.dumps(row) + "\n" for row in rows).encode()
    file = client.files.create(file=("batch.jsonl", io.BytesIO(content)), purpose="batch")
    idempotency = {"Idempotency-Key": "doc-example-" + uuid.uuid4().hex}
    batch = client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h",
                                  metadata=metadata, extra_headers=idempotency)
    deadline = time.monotonic() + 240
    while batch.status not in TERMINAL:
        assert time.monotonic() < deadline, batch.model_dump()
        time.sleep(1)
        batch = client.batches.retrieve(batch.id)
    return batch


def outputs(client: OpenAI, batch: Batch) -> dict[str, dict[str, Any]]:
    assert batch.status == "completed" and batch.output_file_id, batch.model_dump()
    text = client.files.content(batch.output_file_id).text
    return {row["custom_id"]: row for row in map(json.loads, text.splitlines())}


def test_the_sdk_walkthrough_runs_with_a_pinned_revision_and_thinking_turned_off(stack: RunningStack) -> None:
    client = OpenAI(base_url=stack.base_url, api_key=ADMIN_KEY)
    revision = client.models.retrieve(MODEL).model_dump().get("revision")
    assert revision, "the catalogue names the revision a batch pins"
    batch = run(client, [line("q1", "Name the capital of France in one word."),
                         line("q2", "What is 7 times 8? Reply with the number only.")],
                {"revision": revision, "max_price_usd": "3"})
    assert batch.error_file_id is None and batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed) == (2, 2)
    rows = outputs(client, batch)
    assert sorted(rows) == ["q1", "q2"]
    for row in rows.values():
        body = row["response"]["body"]
        assert row["error"] is None and body["choices"][0]["message"]["content"]
        assert body["usage"]["completion_tokens"] <= 64


def test_a_revision_the_deployment_does_not_serve_fails_the_batch_with_revision_unavailable(
        stack: RunningStack) -> None:
    client = OpenAI(base_url=stack.base_url, api_key=ADMIN_KEY)
    batch = run(client, [line("q1", "Name a colour.")], {"revision": "b968826d9c46dd6066d109eabc6255188de91218"})
    assert batch.status == "failed" and batch.errors is not None and batch.errors.data
    assert [(e.code, e.param) for e in batch.errors.data] == [("revision_unavailable", "metadata.revision")]


def test_n_samples_are_the_choices_of_one_line_and_the_same_file_gives_the_same_samples(stack: RunningStack) -> None:
    client = OpenAI(base_url=stack.base_url, api_key=ADMIN_KEY)
    rows = [line("s1", "Name a colour.", n=3, max_tokens=8, temperature=1.0)]
    first, again = (outputs(client, run(client, rows, {}))["s1"] for _ in range(2))
    choices = first["response"]["body"]["choices"]
    assert [choice["index"] for choice in choices] == [0, 1, 2]
    texts = [choice["message"]["content"] for choice in choices]
    assert texts == [choice["message"]["content"] for choice in again["response"]["body"]["choices"]]
    usage = first["response"]["body"]["usage"]
    assert usage["completion_tokens"] <= 3 * 8 and usage["total_tokens"] == (
        usage["prompt_tokens"] + usage["completion_tokens"])
